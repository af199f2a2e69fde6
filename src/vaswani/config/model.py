"""The model's configuration, ``[model]``: everything needed to build one of the three model
families, saved with every run.

Every field is typed; values are checked against the type (``Literal`` choices included) when
the object is built, so a bad value fails early with a message naming the field and the value::

    >>> ModelConfig(arch="decoder", vocab_size=100, d_model=500, n_heads=8)
    Traceback (most recent call last):
    ValueError: d_model (500) must be divisible by n_heads (8)

Some fields default to another field's value (``n_kv_heads=None`` means ``n_heads``): that is
decided once, when the object is built (:meth:`ModelConfig.follows`), so everywhere else
``config.n_kv_heads`` is simply a number. Each field's docstring is its documentation (the
config reference of the docs site is generated from them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .base import ConfigBase
from .family import family, named
from .parts import ExpertsConfig, RopeConfig, WindowConfig, nest

Fixed = Callable[[str], dict[str, Any]]
"""An architecture's name -> the settings it fixes (``{"norm": "rmsnorm", "window.size": 0}``):
:func:`vaswani.architectures.fixes`, handed down by the layers that know the architectures."""


@dataclass(frozen=True)
class ModelConfig(ConfigBase):
    """Everything needed to build a model; saved with every run as ``[model]``."""

    SECTION = "model"

    arch: str = "encoder-decoder"
    """The model family: "encoder-decoder" (a translator), "decoder" (a language model) or
    "encoder" (a classifier or embedder), or a family registered from outside
    (config/family.py)."""
    vocab_size: int = 0
    """Token vocabulary (the source's, for a translator); 0 = not yet known: `vaswani train`
    sets it from the tokenizer."""
    tgt_vocab_size: int | None = None
    """Encoder-decoder: the target vocabulary; None = `vocab_size`."""
    n_classes: int | None = None
    """Encoder only: classes of the head, set from the labels; 0 = no head (embeddings)."""
    d_model: int = 512
    """Width of every hidden state (the paper's d_model)."""
    n_heads: int = 8
    """Attention heads per layer; d_model must divide by it."""
    n_kv_heads: int | None = None
    """Key/value heads: fewer than `n_heads` is grouped-query attention; None = `n_heads`."""
    d_ff: int = 2048
    """Inner width of each feed-forward block."""
    n_layers: int = 6
    """Layers per stack (encoder and decoder alike unless set apart)."""
    n_encoder_layers: int | None = None
    """Encoder stack depth; None = `n_layers`."""
    n_decoder_layers: int | None = None
    """Decoder stack depth; None = `n_layers`."""
    dropout: float = 0.1
    """Dropout on embeddings, sub-layer outputs and the feed-forward's inner activations."""
    attn_dropout: float | None = None
    """Dropout on attention weights; None = `dropout`."""
    max_len: int = 512
    """Longest sequence the model takes, in tokens (longer inputs are truncated with a
    warning)."""
    pad_id: int = 0
    """The padding token's id (its embedding row is zero and it is never attended to);
    set from the tokenizer."""
    norm_first: bool = False
    """False: post-LN as in the paper (norm after each residual sum); True: pre-LN (norm
    before each sub-layer) and a final norm."""
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    """Layer norm (the paper, BERT) or RMSNorm (LLaMA)."""
    norm_eps: float = 1e-5
    """The epsilon added to the variance in every norm."""
    activation: Literal["relu", "gelu", "gelu_tanh", "swiglu", "geglu_tanh"] = "relu"
    """The feed-forward's activation: ReLU (the paper), GELU (BERT), GELU's tanh
    approximation (GPT-2), gated SwiGLU (LLaMA) or gated GELU-tanh (Gemma)."""
    bias: bool = True
    """Biases in every Linear and LayerNorm."""
    qkv_bias: bool | None = None
    """Biases on the attention's q, k and v projections only (Qwen2); None = as `bias`."""
    head_dim: int | None = None
    """Each attention head's width; None = d_model / n_heads (Gemma 3 sets it apart)."""
    qk_norm: bool = False
    """A norm over each head's queries and keys, before rotary positions (Gemma 3)."""
    post_norms: bool = False
    """With `norm_first`: a second norm on each sublayer's output, before the residual sum
    (Gemma's "sandwich" norms)."""
    positional: Literal["sinusoidal", "learned", "rope", "none"] = "sinusoidal"
    """Positions: the paper's sinusoids, a learned table, rotary embeddings (RoPE, set in
    [model.rope]) or none."""
    type_vocab_size: int = 0
    """BERT token-type (segment) embeddings; 0 = none."""
    embed_norm: bool = False
    """A norm after the embeddings (BERT)."""
    scale_embeddings: bool = True
    """Multiply token embeddings by sqrt(d_model), as the paper does."""
    tie_embeddings: bool = True
    """The output projection shares the (target) input embedding's weights."""
    share_embeddings: bool = False
    """Encoder-decoder: one embedding for source and target."""
    pooling: Literal["cls", "mean"] = "mean"
    """Encoder classifier: "cls" takes the first token's state, "mean" averages the real
    tokens'."""
    architecture: str = ""
    """The checkpoint architecture the weights follow ("llama", "qwen2", "gemma3", "bert",
    ...; one file each in vaswani/architectures/): what `vaswani import` records and what
    `vaswani export --format hf` writes back. "" = vaswani's own, as the fields here set it
    (exported as the architecture those fields match)."""
    origin: str = ""
    """An imported checkpoint's Hugging Face class (`MistralForCausalLM`, ...), as its
    config.json named it; a run imported before `architecture` existed is read by it (a
    Mistral folder's run exports as Mistral)."""
    attention: Literal["auto", "sdpa", "reference"] = "auto"
    """Attention kernel: "reference" (written-out matmuls), "sdpa" (PyTorch's fused
    kernel), or "auto": reference for bf16 on a CPU up to 512 keys, sdpa elsewhere."""
    rope: RopeConfig = RopeConfig()
    """[model.rope]: the rotary embeddings' frequencies (with `positional = "rope"`)."""
    window: WindowConfig = WindowConfig()
    """[model.window]: a language model's local layers (sliding-window attention)."""
    experts: ExpertsConfig = ExpertsConfig()
    """[model.experts]: a language model's feed-forward blocks as a mixture of experts."""

    def validate(self) -> None:
        positive = ["d_model", "n_heads", "d_ff", "n_layers", "max_len"]
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if self.max_len < 2:
            raise ValueError(f"max_len ({self.max_len}) must be at least 2: a sequence needs "
                             "a token and <eos>")
        if self.n_classes is not None and self.n_classes < 0:
            raise ValueError(f"n_classes ({self.n_classes}) must not be negative")
        for name in ["tgt_vocab_size", "n_kv_heads", "n_encoder_layers", "n_decoder_layers"]:
            value = getattr(self, name)
            if value is not None and value <= 0 and name not in self._followed:
                raise ValueError(f"{name} ({value}) must be positive")
        if self.vocab_size < 0:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be positive")
        if self.d_model % self.n_heads and "head_dim" in self._followed:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads}), "
                "or head_dim set")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        for name in ["dropout", "attn_dropout"]:
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} ({value}) must be in [0, 1)")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size ({self.type_vocab_size}) must not be negative")
        if self.positional == "rope" and self.head_dim % 2:
            raise ValueError(f"positional 'rope' needs an even head dim, got {self.head_dim}")
        if self.head_dim <= 0:
            raise ValueError(f"head_dim ({self.head_dim}) must be positive")
        if self.rope.nope_every and self.positional != "rope":
            raise ValueError(f"[model.rope] nope_every ({self.rope.nope_every}) takes rotary "
                             "positions away from some layers; positional is "
                             f"{self.positional!r}, not 'rope'")
        kind = family(self.arch)
        if self.experts.count and not kind.language_model:
            raise ValueError(f"[model.experts] count ({self.experts.count}) is only used by "
                             f"arch {named(lambda f: f.language_model)}")
        if self.post_norms and not self.norm_first:
            raise ValueError("post_norms (True) needs norm_first (True): the second norm of "
                             "a pre-norm block")
        if self.window.size and not kind.language_model:
            raise ValueError(f"[model.window] size ({self.window.size}) is only used by "
                             f"arch {named(lambda f: f.language_model)}")
        if self.norm_eps <= 0:
            raise ValueError(f"norm_eps ({self.norm_eps}) must be positive")
        if self.vocab_size and not 0 <= self.pad_id < self.vocab_size:
            raise ValueError(f"pad_id ({self.pad_id}) must be in [0, vocab_size={self.vocab_size})")
        if not kind.classes and self.n_classes is not None:
            raise ValueError(f"n_classes ({self.n_classes}) is only used by arch "
                             f"{named(lambda f: f.classes)}")
        if not kind.cross and self.tgt_vocab_size is not None:
            raise ValueError(f"tgt_vocab_size ({self.tgt_vocab_size}) is only used by arch "
                             f"{named(lambda f: f.cross)}")
        if (self.share_embeddings and self.tgt_vocab_size is not None
                and self.tgt_vocab_size != self.vocab_size):
            raise ValueError(
                f"share_embeddings (True) needs tgt_vocab_size ({self.tgt_vocab_size}) "
                f"equal to vocab_size ({self.vocab_size})")

    def numbers(self) -> int:
        """About how many numbers the model holds (its parameters and position tables),
        from the config alone: what :func:`vaswani.models.build_model` checks against the
        device's memory before it makes anything."""
        d, heads = self.d_model, self.n_heads
        head_dim = self.head_dim or d // heads
        kv = head_dim * (self.n_kv_heads or heads)
        attention = 2 * d * head_dim * heads + 2 * d * kv
        gated = 3 if self.activation in ("swiglu", "geglu_tanh") else 2
        feed_forward = gated * d * self.d_ff
        if self.experts.count:  # each expert's block, and the router
            feed_forward = self.experts.count * (gated * d * self.experts.d_ff + d)
        kind = family(self.arch)
        encoder = self.n_encoder_layers if kind.encoder else 0
        decoder = self.n_decoder_layers if kind.decoder else 0
        cross = attention if kind.cross else 0
        layers = encoder * (attention + feed_forward) + decoder * (attention + cross + feed_forward)
        vocab = self.vocab_size + (self.tgt_vocab_size or 0) * kind.cross
        tables = self.max_len * d * (self.positional in ("sinusoidal", "learned"))
        return layers + vocab * d * (1 if self.tie_embeddings else 2) + tables

    def require_complete(self) -> None:
        """The values ``vaswani train`` fills in from the data must be set to build a model."""
        if self.vocab_size == 0:
            raise ValueError("vocab_size (0) must be set to build a model "
                             "(vaswani train sets it from the tokenizer)")
        if family(self.arch).classes and self.n_classes is None:
            raise ValueError(f"n_classes (None) must be set for arch {self.arch!r} "
                             "(vaswani train sets it from the labels)")

    def follows(self) -> dict:
        """What ``None`` means, decided once: the number of k/v heads is the number of heads,
        each stack has ``n_layers`` layers, attention dropout is the dropout, a head is
        ``d_model / n_heads`` wide, an expert as wide as the feed-forward block, and the
        target vocabulary is the source's. Fields a model family does not use stay None."""
        out = {"n_kv_heads": self.n_heads, "attn_dropout": self.dropout,
               "head_dim": self.d_model // max(self.n_heads, 1), "experts.d_ff": self.d_ff}
        kind = family(self.arch)
        if kind.encoder:
            out["n_encoder_layers"] = self.n_layers
        if kind.decoder:
            out["n_decoder_layers"] = self.n_layers
        if kind.cross:
            out["tgt_vocab_size"] = self.vocab_size
        return out

    def to_dict(self, fixed: Fixed | None = None) -> dict:
        """As every section's, with [model.rope], [model.window] and [model.experts] left out
        where a model does not use them (all their values the defaults). With ``fixed`` and a
        named architecture: ``architecture`` first, and the settings it fixes left out (a run
        names its architecture and what varies)."""
        out = super().to_dict()
        if self.architecture and fixed is not None:
            out = {"architecture": out.pop("architecture"), **out}
            for option, value in fixed(self.architecture).items():
                section, dot, key = option.rpartition(".")
                if self.setting(option) == value:
                    del (out[section] if dot else out)[key]
        for name, part in self.parts().items():
            if out[name] == {key: value for key, value in part().to_dict().items()
                             if key in out[name]}:
                del out[name]
        return out

    def setting(self, name: str):
        """The value of ``name``, a field of [model] or of one of its sections
        (``"window.size"``)."""
        section, dot, key = name.rpartition(".")
        return getattr(getattr(self, section) if dot else self, key)

    @staticmethod
    def where(name: str) -> str:
        """How a config file names the setting ``name``: ``"[model.window] size"``."""
        section, dot, key = name.rpartition(".")
        return f"[model.{section}] {key}" if dot else f"[model] {name}"

    @classmethod
    def from_dict(cls, data: dict, fixed: Fixed | None = None):
        """A ``[model]`` dict: an older run's flat keys (``rope_base``, ...) moved into their
        sections first (:func:`~vaswani.config.parts.nest`); where it names an architecture,
        the settings that architecture fixes (``fixed(name)``) filled in, and one given
        another value refused by name."""
        data = nest(data)
        name = data.get("architecture")
        if name and fixed is not None:
            for option, value in fixed(name).items():
                section, dot, key = option.rpartition(".")
                place = data.setdefault(section, {}) if dot else data
                if not isinstance(place, dict):
                    continue  # a section given as something else: the type check names it
                if place.setdefault(key, value) != value:
                    raise ValueError(f"{cls.where(option)} = {place[key]!r}: architecture "
                                     f"{name!r} fixes it at {value!r} (leave it out)")
        elif name and "arch" not in data:
            raise ValueError(f"[model] architecture = {name!r} leaves out the settings that "
                             "architecture fixes: read the file with vaswani.rundir."
                             "read_config (or pass fixed=vaswani.architectures.fixes)")
        return super().from_dict(data)

    def replace(self, **changes):
        """A copy with ``changes``, which may name a section's fields the older, flat way
        (``rope_base=``)."""
        nested = nest(changes)
        for name in self.parts():
            if isinstance(nested.get(name), dict):
                nested[name] = getattr(self, name).replace(**nested[name])
        return super().replace(**nested)
