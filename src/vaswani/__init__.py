"""vaswani: the Transformer of "Attention Is All You Need", written out in PyTorch.

Public API::

    from vaswani import ModelConfig, build_model, EncoderDecoder, DecoderLM, EncoderClassifier
    run = vaswani.load("runs/copy")            # a directory written by `vaswani train`
    run.translate(["abc"]), run.generate("To be"), run.classify(["some text"])
"""

from .config import ModelConfig
from .inference import Run, load
from .models import DecoderLM, EncoderClassifier, EncoderDecoder, build_model

__all__ = ["DecoderLM", "EncoderClassifier", "EncoderDecoder", "ModelConfig", "Run",
           "build_model", "load"]
__version__ = "0.1.0"
