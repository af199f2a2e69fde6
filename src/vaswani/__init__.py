"""vaswani: the Transformer of "Attention Is All You Need", written out in PyTorch.

Public API::

    from vaswani import ModelConfig, build_model, EncoderDecoder, DecoderLM, EncoderClassifier
"""

from .config import ModelConfig
from .models import DecoderLM, EncoderClassifier, EncoderDecoder, build_model

__all__ = ["DecoderLM", "EncoderClassifier", "EncoderDecoder", "ModelConfig", "build_model"]
__version__ = "0.1.0"
