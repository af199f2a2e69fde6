"""Configuration: frozen, validated dataclasses that round-trip through dict and TOML."""

from .base import ConfigBase, coerce, dump_toml, load_toml, parse_text, unknown_key_error
from .file import SECTIONS, RunConfig, apply_overrides, load_run_config, parse_value
from .finetune import FinetuneConfig
from .model import ModelConfig
from .sections import DataConfig, DecodeConfig, TrainConfig

__all__ = [
    "SECTIONS", "ConfigBase", "DataConfig", "DecodeConfig", "FinetuneConfig", "ModelConfig",
    "RunConfig",
    "TrainConfig", "apply_overrides", "coerce", "dump_toml", "load_run_config", "load_toml",
    "parse_text", "parse_value", "unknown_key_error",
]
