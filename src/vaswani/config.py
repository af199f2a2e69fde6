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

__all__ = ["ConfigBase", "DataConfig", "DecodeConfig", "ModelConfig", "RunConfig", "TrainConfig",
           "dump_toml", "load_toml"]


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
        if isinstance(value, str) and item is str:
            value = [value]  # a single path where a list of paths is expected
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
    vocab_size: int = 0  # 0 = not yet known: vaswani train sets it from the tokenizer
    tgt_vocab_size: int | None = None  # encoder-decoder only; None = vocab_size
    n_classes: int | None = None  # encoder only; vaswani train sets it from the labels
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
        positive = ["d_model", "n_heads", "d_ff", "n_layers", "max_len"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        for name in ["tgt_vocab_size", "n_classes", "n_kv_heads", "n_encoder_layers",
                     "n_decoder_layers"]:
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} ({value}) must be positive")
        if self.vocab_size < 0:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be positive")
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
        if self.vocab_size and not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be in [0, vocab_size={self.vocab_size})")
        if self.arch != "encoder" and self.n_classes is not None:
            raise ValueError(f"n_classes ({self.n_classes}) is only used by arch 'encoder'")
        if self.arch != "encoder-decoder" and self.tgt_vocab_size is not None:
            raise ValueError(
                f"tgt_vocab_size ({self.tgt_vocab_size}) is only used by arch 'encoder-decoder'")
        if (self.share_embeddings and self.tgt_vocab_size is not None
                and self.tgt_vocab_size != self.vocab_size):
            raise ValueError(
                f"share_embeddings (True) needs tgt_vocab_size ({self.tgt_vocab_size}) "
                f"equal to vocab_size ({self.vocab_size})")

    def require_complete(self) -> None:
        """The values ``vaswani train`` fills in from the data must be set to build a model."""
        if self.vocab_size == 0:
            raise ValueError("vocab_size (0) must be set to build a model "
                             "(vaswani train sets it from the tokenizer)")
        if self.arch == "encoder" and self.n_classes is None:
            raise ValueError("n_classes (None) must be set for arch 'encoder' "
                             "(vaswani train sets it from the labels)")

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


@dataclass(frozen=True)
class DataConfig(ConfigBase):
    """Where the examples come from and how they are tokenised and batched (``[data]``).

    ``dataset`` names a built-in dataset (``copy``) or a prepared one; otherwise ``train``
    lists files: one TSV/CSV/JSONL file, two aligned plain-text files (source, target) for
    translation, or any number of text files (globs allowed) for language modelling.
    Without ``valid`` files, ``valid_fraction`` of the training examples is held out by seed.
    """

    SECTION = "data"

    dataset: str = ""
    train: list[str] = dataclasses.field(default_factory=list)
    valid: list[str] = dataclasses.field(default_factory=list)
    test: list[str] = dataclasses.field(default_factory=list)
    format: Literal["auto", "tsv", "csv", "jsonl", "text", "aligned"] = "auto"
    valid_fraction: float = 0.05
    split_seed: int = 0
    tokenizer: Literal["char", "bpe"] = "bpe"
    vocab_size: int = 8000  # BPE only; the char vocabulary is whatever the text holds
    shared_vocab: bool = True  # translation: one tokenizer for source and target
    max_tokens: int = 4096  # token budget of one (micro-)batch, padding included
    batch_size: int = 32  # language modelling: windows per batch
    block_size: int = 256  # language modelling: tokens per window
    max_skip: int = 0  # bad lines to skip (counted and reported) before failing

    def validate(self) -> None:
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"valid_fraction ({self.valid_fraction}) must be in [0, 1)")
        for name in ("vocab_size", "max_tokens", "batch_size", "block_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if self.max_skip < 0:
            raise ValueError(f"max_skip ({self.max_skip}) must be >= 0")


@dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """The optimisation and the bookkeeping around it (``[train]``)."""

    SECTION = "train"

    max_steps: int = 1000  # optimizer steps
    seed: int = 0
    lr: float = 5e-4  # peak learning rate
    schedule: Literal["noam", "cosine", "constant"] = "cosine"
    warmup: int = 100  # optimizer steps of linear warmup
    min_lr: float = 0.0  # cosine floor
    weight_decay: float = 0.01
    beta1: float = 0.9
    beta2: float = 0.98
    label_smoothing: float = 0.0
    clip_norm: float = 1.0  # 0 disables clipping
    grad_accum: int = 1  # micro-batches per optimizer step
    bf16: bool = False  # autocast matmuls to bfloat16 (CPU with AMX, or CUDA)
    compile: bool = False  # torch.compile the model
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 50  # 0 = the whole validation set
    metric_examples: int = 200  # examples decoded for the task metric (0 = off)
    save_every: int = 200
    best_metric: str = "valid_loss"  # or a task metric: exact_match, bleu, accuracy
    patience: int = 0  # early stopping: evaluations without improvement (0 = off)

    def validate(self) -> None:
        for name in ("max_steps", "grad_accum", "log_every", "eval_every", "save_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if self.lr <= 0:
            raise ValueError(f"lr ({self.lr}) must be positive")
        for name in ("warmup", "patience", "eval_batches", "metric_examples"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.schedule == "noam" and self.warmup == 0:
            raise ValueError("warmup (0) must be positive for the noam schedule")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")


@dataclass(frozen=True)
class DecodeConfig(ConfigBase):
    """How sequences are generated (``[decode]``). Output length is capped at
    ``max_len_a * source_length + max_len_b`` tokens."""

    SECTION = "decode"

    max_len_a: float = 1.5
    max_len_b: int = 10

    def validate(self) -> None:
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ValueError(f"max_len_a ({self.max_len_a}) and max_len_b ({self.max_len_b}) "
                             "must be >= 0")


SECTIONS: dict[str, type[ConfigBase]] = {
    "model": ModelConfig, "data": DataConfig, "train": TrainConfig, "decode": DecodeConfig,
}


@dataclass(frozen=True)
class RunConfig:
    """All four sections of a config file."""

    model: ModelConfig
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunConfig:
        for section in data:
            if section not in SECTIONS:
                raise unknown_key_error("", section, SECTIONS)
        return cls(**{name: kind.from_dict(data.get(name, {}))
                      for name, kind in SECTIONS.items()})

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {name: getattr(self, name).to_dict() for name in SECTIONS}

    def to_toml(self) -> str:
        return dump_toml(self.to_dict())


def parse_value(section: str, key: str, text: str) -> Any:
    """Parse the text of ``--set section.key=TEXT`` by the type of that field."""
    kind = SECTIONS[section]
    hints = typing.get_type_hints(kind)
    if key not in hints or key == "SECTION":
        raise unknown_key_error(section, key, [f.name for f in dataclasses.fields(kind)])
    hint = hints[key]
    options = typing.get_args(hint) if typing.get_origin(hint) in (
        typing.Union, types.UnionType) else (hint,)
    if text.lower() in ("none", "null") and type(None) in options:
        return None
    for option in options:
        origin = typing.get_origin(option)
        if option is bool:
            if text.lower() in ("true", "false", "1", "0", "yes", "no", "on", "off"):
                return text.lower() in ("true", "1", "yes", "on")
        elif option is int:
            try:
                return int(text)
            except ValueError:
                pass
        elif option is float:
            try:
                return float(text)
            except ValueError:
                pass
        elif origin in (list, tuple):
            return [part for part in text.split(",") if part]
        elif option is str or origin is Literal:
            return text
    raise ValueError(f"--set {section}.{key}={text}: expected {_describe(hint)}")


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a config dict (a new dict is returned)."""
    out = {name: dict(values) for name, values in data.items()}
    for item in overrides:
        name, sep, text = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. train.lr=3e-4")
        if section not in SECTIONS:
            raise unknown_key_error("", section, SECTIONS)
        out.setdefault(section, {})[key] = parse_value(section, key, text.strip())
    return out


def load_run_config(path: str | Path, overrides: typing.Iterable[str] = ()) -> RunConfig:
    """Read a config file, apply ``--set`` overrides, validate; errors name the file."""
    data = apply_overrides(load_toml(path), overrides)
    try:
        return RunConfig.from_dict(data)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None


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
