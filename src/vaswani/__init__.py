"""vaswani: the Transformer of "Attention Is All You Need", written out in PyTorch.

Public API::

    from vaswani import ModelConfig, build_model, EncoderDecoder, DecoderLM, EncoderClassifier
    run = vaswani.load("runs/copy")            # a directory written by `vaswani train`
    run.translate(["abc"])                     # a Translator; a LanguageModel generates,
    run.generate("To be"), run.classify(["some text"])   # an Encoder classifies and embeds
"""

from .config import ModelConfig
from .inference import Encoder, LanguageModel, Run, Translator, load
from .models import DecoderLM, EncoderClassifier, EncoderDecoder, build_model

__all__ = ["DecoderLM", "Encoder", "EncoderClassifier", "EncoderDecoder", "LanguageModel",
           "ModelConfig", "Run", "Translator", "build_model", "load"]
__version__ = "0.1.0"
