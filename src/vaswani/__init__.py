"""vaswani: the Transformer of "Attention Is All You Need", written out in PyTorch.

Public API::

    from vaswani import ModelConfig, build_model, EncoderDecoder, DecoderLM, EncoderClassifier
    run = vaswani.load("runs/copy")            # a directory written by `vaswani train`
    run.translate(["abc"])                     # a Translator; a LanguageModel generates,
    run.generate("To be"), run.classify(["some text"])   # an Encoder classifies and embeds

Each name is imported on first use (PEP 562), so that ``import vaswani.nn`` reads the
building blocks alone.
"""

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names as static tools read them (editors, the docs' API pages)
    from .config import ModelConfig
    from .inference import Encoder, LanguageModel, Run, Translator, load
    from .models import DecoderLM, EncoderClassifier, EncoderDecoder, build_model

_WHERE = {"ModelConfig": "config", "Encoder": "inference", "LanguageModel": "inference",
          "Run": "inference", "Translator": "inference", "load": "inference",
          "DecoderLM": "models", "EncoderClassifier": "models", "EncoderDecoder": "models",
          "build_model": "models"}

__all__ = ["DecoderLM", "Encoder", "EncoderClassifier", "EncoderDecoder", "LanguageModel",
           "ModelConfig", "Run", "Translator", "build_model", "load"]
__version__ = "0.1.0"


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'vaswani' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
