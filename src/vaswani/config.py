"""Configuration: frozen, validated dataclasses that round-trip through dict and TOML.

Every field is typed; values are checked against the type (``Literal`` choices included) when
the object is built, so a bad value fails early with a message naming the field and the value::

    >>> ModelConfig(arch="decoder", vocab_size=100, d_model=500, n_heads=8)
    Traceback (most recent call last):
    ValueError: d_model (500) must be divisible by n_heads (8)

``None`` means "derive from another field" (for example ``tgt_vocab_size=None`` means the
target vocabulary is the source vocabulary); the derived values are exposed as properties.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = ["ConfigBase", "ModelConfig", "dump_toml", "load_toml"]


def _describe(hint: Any) -> str:
    if typing.get_origin(hint) is Literal:
        return " | ".join(repr(c) for c in typing.get_args(hint))
    if isinstance(hint, type):
        return hint.__name__
    return str(hint)


def coerce(name: str, value: Any, hint: Any) -> Any:
    """Check ``value`` against the type ``hint`` and return it (ints are accepted as floats).

    Raises ``ValueError`` naming the field when the value does not fit.
    """
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce(name, value, option)
            except ValueError as e:
                errors.append(str(e))
        raise ValueError(errors[0] if len(errors) == 1 else f"{name} ({value!r}) must be {hint}")
    if origin is Literal:
        if value not in typing.get_args(hint):
            raise ValueError(f"{name} ({value!r}) must be one of {_describe(hint)}")
        return value
    if origin in (list, tuple):
        (item,) = typing.get_args(hint)[:1]
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{name} ({value!r}) must be a list")
        return tuple(coerce(f"{name}[{i}]", v, item) for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{name} ({value!r}) must be a number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} ({value!r}) must be an integer")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} ({value!r}) must be true or false")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{name} ({value!r}) must be a string")
        return value
    raise TypeError(f"unsupported config type for {name}: {hint}")  # a bug in this file


def unknown_key_error(section: str, key: str, known: typing.Iterable[str]) -> ValueError:
    """``ValueError`` for an unknown key, suggesting the closest known name."""
    close = difflib.get_close_matches(key, list(known), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    where = f"[{section}] " if section else ""
    return ValueError(f"unknown key {where}'{key}'{hint}")


class ConfigBase:
    """Shared behaviour of the frozen config dataclasses: type checks and dict round trips."""

    SECTION = ""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in dataclasses.fields(self):
            value = coerce(f.name, getattr(self, f.name), hints[f.name])
            object.__setattr__(self, f.name, value)
        self.validate()

    def validate(self) -> None:
        """Cross-field checks; subclasses override."""

    def to_dict(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]):
        names = {f.name for f in dataclasses.fields(cls)}
        for key in data:
            if key not in names:
                raise unknown_key_error(cls.SECTION, key, names)
        return cls(**data)

    def replace(self, **changes: Any):
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class ModelConfig(ConfigBase):
    """Everything needed to build a model; saved with every run as ``[model]``."""

    SECTION = "model"

    arch: Literal["encoder-decoder", "decoder", "encoder"] = "encoder-decoder"
    vocab_size: int = 0
    tgt_vocab_size: int | None = None  # encoder-decoder only; None = vocab_size
    n_classes: int | None = None  # encoder only
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads
    d_ff: int = 2048
    n_layers: int = 6
    n_encoder_layers: int | None = None  # None = n_layers
    n_decoder_layers: int | None = None  # None = n_layers
    dropout: float = 0.1
    attn_dropout: float | None = None  # dropout on attention weights; None = dropout
    max_len: int = 512
    pad_id: int = 0
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN + final norm
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    activation: Literal["relu", "gelu"] = "relu"
    bias: bool = True  # biases in every Linear and LayerNorm
    positional: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper)
    tie_embeddings: bool = True  # output projection shares the (target) input embedding
    share_embeddings: bool = False  # encoder-decoder: one embedding for source and target
    pooling: Literal["cls", "mean"] = "mean"  # encoder classifier
    attention: Literal["sdpa", "reference"] = "sdpa"

    def validate(self) -> None:
        positive = ["vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        for name in ["tgt_vocab_size", "n_classes", "n_kv_heads", "n_encoder_layers",
                     "n_decoder_layers"]:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} ({value}) must be positive")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        for name in ["dropout", "attn_dropout"]:
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} ({value}) must be in [0, 1)")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps ({self.norm_eps}) must be positive")
        if not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be in [0, vocab_size={self.vocab_size})")
        if self.arch == "encoder" and self.n_classes is None:
            raise ValueError("n_classes (None) must be set for arch 'encoder'")
        if self.arch != "encoder" and self.n_classes is not None:
            raise ValueError(f"n_classes ({self.n_classes}) is only used by arch 'encoder'")
        if self.arch != "encoder-decoder" and self.tgt_vocab_size is not None:
            raise ValueError(
                f"tgt_vocab_size ({self.tgt_vocab_size}) is only used by arch 'encoder-decoder'")
        if self.share_embeddings and self.target_vocab_size != self.vocab_size:
            raise ValueError(
                f"share_embeddings (True) needs tgt_vocab_size ({self.tgt_vocab_size}) "
                f"equal to vocab_size ({self.vocab_size})")

    # Derived values: one place decides what None means.
    @property
    def target_vocab_size(self) -> int:
        return self.vocab_size if self.tgt_vocab_size is None else self.tgt_vocab_size

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def encoder_depth(self) -> int:
        return self.n_layers if self.n_encoder_layers is None else self.n_encoder_layers

    @property
    def decoder_depth(self) -> int:
        return self.n_layers if self.n_decoder_layers is None else self.n_decoder_layers

    @property
    def attn_dropout_p(self) -> float:
        return self.dropout if self.attn_dropout is None else self.attn_dropout


# --- TOML -----------------------------------------------------------------------------------

def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {value!r} to TOML")


def dump_toml(sections: dict[str, dict[str, Any]]) -> str:
    """Write ``{section: {key: scalar}}`` as TOML. ``None`` values are left out (TOML has no
    null, and every field whose value may be None has None as its default)."""
    lines = []
    for section, values in sections.items():
        lines.append(f"[{section}]")
        for key, value in values.items():
            if value is not None:
                lines.append(f"{key} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML file; a syntax error names the file."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"config file not found: {path}") from None
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: invalid TOML: {e}") from None
