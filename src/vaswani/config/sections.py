"""Configuration: frozen, validated dataclasses that round-trip through dict and TOML.

Every field is typed; values are checked against the type (``Literal`` choices included) when
the object is built, so a bad value fails early with a message naming the field and the value::

    >>> ModelConfig(arch="decoder", vocab_size=100, d_model=500, n_heads=8)
    Traceback (most recent call last):
    ValueError: d_model (500) must be divisible by n_heads (8)

Some fields default to another field's value (``n_kv_heads=None`` means ``n_heads``): that is
decided once, when the object is built (:meth:`ModelConfig.follows`), so everywhere else
``config.n_kv_heads`` is simply a number.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

from .base import ConfigBase

MAX_BEAM = 128  # wider beams cost memory and time and rarely help
MAX_NEW_TOKENS = 100_000


@dataclass(frozen=True)
class ModelConfig(ConfigBase):
    """Everything needed to build a model; saved with every run as ``[model]``."""

    SECTION = "model"

    arch: Literal["encoder-decoder", "decoder", "encoder"] = "encoder-decoder"
    vocab_size: int = 0  # 0 = not yet known: vaswani train sets it from the tokenizer
    tgt_vocab_size: int | None = None  # encoder-decoder: target vocabulary; None = vocab_size
    n_classes: int | None = None  # encoder only; set from the labels; 0 = no head (embeddings)
    d_model: int = 512
    n_heads: int = 8
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads
    d_ff: int = 2048
    n_layers: int = 6
    n_encoder_layers: int | None = None  # encoder stack depth; None = n_layers
    n_decoder_layers: int | None = None  # decoder stack depth; None = n_layers
    dropout: float = 0.1
    attn_dropout: float | None = None  # dropout on attention weights; None = dropout
    max_len: int = 512
    pad_id: int = 0
    norm_first: bool = False  # False: post-LN as in the paper; True: pre-LN + final norm
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    norm_eps: float = 1e-5
    activation: Literal["relu", "gelu", "swiglu"] = "relu"  # swiglu: gated, LLaMA
    bias: bool = True  # biases in every Linear and LayerNorm
    positional: Literal["sinusoidal", "learned", "rope", "none"] = "sinusoidal"
    rope_base: float = 10000.0  # positional = "rope": rotary embeddings' base
    type_vocab_size: int = 0  # BERT token-type (segment) embeddings; 0 = none
    embed_norm: bool = False  # a norm after the embeddings (BERT)
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) (paper)
    tie_embeddings: bool = True  # output projection shares the (target) input embedding
    share_embeddings: bool = False  # encoder-decoder: one embedding for source and target
    pooling: Literal["cls", "mean"] = "mean"  # encoder classifier
    attention: Literal["auto", "sdpa", "reference"] = "auto"

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
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        for name in ["dropout", "attn_dropout"]:
            value = getattr(self, name)
            if value is not None and not 0.0 <= value < 1.0:
                raise ValueError(f"{name} ({value}) must be in [0, 1)")
        if self.rope_base <= 0:
            raise ValueError(f"rope_base ({self.rope_base}) must be positive")
        if self.type_vocab_size < 0:
            raise ValueError(f"type_vocab_size ({self.type_vocab_size}) must not be negative")
        if self.positional == "rope" and (self.d_model // self.n_heads) % 2:
            raise ValueError(f"positional 'rope' needs an even head dim, got "
                             f"{self.d_model} / {self.n_heads}")
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

    def follows(self) -> dict:
        """What ``None`` means, decided once: the number of k/v heads is the number of heads,
        each stack has ``n_layers`` layers, attention dropout is the dropout, and the target
        vocabulary is the source's. Fields a model family does not use stay None."""
        out = {"n_kv_heads": self.n_heads, "attn_dropout": self.dropout}
        if self.arch in ("encoder-decoder", "encoder"):
            out["n_encoder_layers"] = self.n_layers
        if self.arch in ("encoder-decoder", "decoder"):
            out["n_decoder_layers"] = self.n_layers
        if self.arch == "encoder-decoder":
            out["tgt_vocab_size"] = self.vocab_size
        return out


@dataclass(frozen=True)
class DataConfig(ConfigBase):
    """Where the examples come from and how they are tokenised and batched (``[data]``).

    ``dataset`` names a built-in dataset (``copy``) or a prepared one; otherwise ``train``
    lists files: one TSV/CSV/JSONL file, two aligned plain-text files (source, target) for
    translation, or any number of text files (globs allowed) for language modelling.
    Without ``valid`` files, ``valid_fraction`` of the training examples is held out by seed.
    """

    SECTION = "data"

    task: str | None = None  # what the data is for: a task's name ("translation", "lm",
    # "classification", or one of your own); None = the task of the [model] arch
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
    pad_to_multiple: int = 0  # pairs and labelled texts: pad each batch's length up to a
    # multiple of this (0: to its longest): fewer shapes for torch.compile, aligned GPU matmuls
    max_skip: int = 0  # bad lines to skip (counted and reported) before failing
    tokenizer_sample: int = 20_000_000  # bytes of training data the tokenizer learns from at
    # most: a larger training set gives a seeded random sample of whole examples (or lines)

    def validate(self) -> None:
        if not 0.0 <= self.valid_fraction < 1.0:
            raise ValueError(f"valid_fraction ({self.valid_fraction}) must be in [0, 1)")
        if self.valid_fraction == 0 and not self.valid and not self.dataset:
            raise ValueError("valid_fraction (0) with no [data] valid files leaves no validation "
                             "data: nothing could be evaluated and no best model kept; give "
                             "valid files or a valid_fraction above 0")
        for name in ("vocab_size", "max_tokens", "batch_size", "block_size", "tokenizer_sample"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        for name in ("max_skip", "pad_to_multiple"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")


@dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """The optimisation and the bookkeeping around it (``[train]``)."""

    SECTION = "train"

    max_steps: int = 1000  # optimizer steps
    schedule_steps: int | None = None  # the LR schedule's length; None = max_steps (fixed when
    # a run starts, so that resuming with a larger max_steps continues the same schedule)
    max_minutes: float = 0.0  # wall-clock budget: stop, evaluate and save when spent (0 = off)
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
    max_skipped_steps: int = 10  # steps with a non-finite loss or gradient update nothing; more
    # than this many in a row stop the run (the last checkpoint is kept)
    grad_accum: int = 1  # micro-batches per optimizer step
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"  # autocast: bf16 (CUDA since Ampere,
    # CPUs with AMX or AVX512-BF16), fp16 with a gradient scaler (GPUs without fast bf16)
    bf16: bool = False  # older name for precision = "bf16" (config.toml keeps both in step)
    compile: bool = False  # torch.compile the model
    parallel: Literal["ddp", "fsdp"] = "ddp"  # several processes (torchrun): "ddp" keeps the
    # whole model, gradients and optimizer on every rank; "fsdp" shards them over the ranks,
    # each transformer layer a unit (docs/distributed.md)
    checkpoint_activations: bool = False  # recompute each layer's activations in the backward
    # pass instead of keeping them: less memory, about a third more compute; same gradients
    collective_timeout: float = 300.0  # several processes: seconds a training step's exchange
    # (gradients, counts) waits for the other ranks before giving up with an error (a rank that
    # hangs without dying); waiting for rank 0's work alone (data, evaluation, saving) is not
    # limited by it
    tensorboard: bool = False  # TensorBoard event files in RUN_DIR/tensorboard/ (rank 0)
    init_from: str = ""  # a run directory (e.g. from `vaswani import`) to start from: its
    # [model], tokenizer and weights are used; a new classification head is initialised
    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:1", ...
    log_every: int = 10
    eval_every: int = 200
    eval_batches: int = 50  # 0 = the whole validation set
    metric_examples: int = 200  # examples decoded for the task metric (0 = off)
    save_every: int = 200
    keep_checkpoints: int = 0  # keep the weights of the last N checkpoints (checkpoints/) and
    # write their average (averaged.safetensors) when training ends; 0 = off
    best_metric: str = "valid_loss"  # or a task metric: exact_match, bleu, accuracy
    patience: int = 0  # early stopping: evaluations without improvement (0 = off)

    @property
    def asked_precision(self) -> str:
        """The precision asked for, ``bf16 = true`` (the older key) included."""
        return "bf16" if self.bf16 and self.precision == "fp32" else self.precision

    def validate(self) -> None:
        if self.collective_timeout <= 0:
            raise ValueError(f"collective_timeout ({self.collective_timeout}) must be positive "
                             "(seconds)")
        for name in ("max_steps", "grad_accum", "log_every", "eval_every", "save_every"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if self.lr <= 0:
            raise ValueError(f"lr ({self.lr}) must be positive")
        if not 0.0 <= self.min_lr <= self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must be in [0, lr ({self.lr})]")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be in [0, 1)")
        for name in ("weight_decay", "clip_norm"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if not re.fullmatch(r"auto|cpu|mps|cuda(:\d+)?", self.device):
            raise ValueError(f"device ({self.device!r}) must be 'auto', 'cpu', 'cuda', "
                             "'cuda:N' or 'mps'")
        if self.best_metric != "valid_loss" and self.metric_examples == 0:
            raise ValueError(f"best_metric ({self.best_metric!r}) is a task metric, but "
                             "metric_examples (0) turns task metrics off; no best model "
                             "would ever be kept")
        if self.max_minutes < 0:
            raise ValueError(f"max_minutes ({self.max_minutes}) must be >= 0")
        if self.bf16 and self.precision == "fp16":
            raise ValueError("bf16 = true and precision = 'fp16' disagree: set precision only")
        if self.parallel == "fsdp" and self.precision == "fp16":
            raise ValueError("parallel = 'fsdp' trains in fp32 or bf16, not fp16 (FSDP's "
                             "sharded gradients have no gradient scaler here): set precision "
                             "= 'bf16' or 'fp32'")
        if self.schedule_steps is not None and self.schedule_steps <= 0:
            raise ValueError(f"schedule_steps ({self.schedule_steps}) must be positive")
        for name in ("warmup", "patience", "eval_batches", "metric_examples", "max_skipped_steps",
                     "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.schedule == "noam" and self.warmup == 0:
            raise ValueError("warmup (0) must be positive for the noam schedule")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing ({self.label_smoothing}) must be in [0, 1)")


    def follows(self) -> dict:
        return {"schedule_steps": self.max_steps}


@dataclass(frozen=True)
class DecodeConfig(ConfigBase):
    """How sequences are generated (``[decode]``); the commands' flags override these.

    Translation output is capped at ``max_len_a * source_length + max_len_b`` tokens. Beam
    search ranks hypotheses by log P / ((5 + length) / 6) ** length_penalty (GNMT).
    """

    SECTION = "decode"

    beam: int = 4
    n_best: int = 1
    length_penalty: float = 0.6
    max_len_a: float = 1.5
    max_len_b: int = 10
    max_new_tokens: int = 200  # language models
    temperature: float = 1.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    repetition_penalty: float = 1.0  # > 1 discourages tokens already in the output (1 = off)
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from a generated token's score
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per occurrence so far
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size (0 = off)
    min_length: int = 0  # tokens to generate before <eos> may end the output
    stop: list[str] = dataclasses.field(default_factory=list)  # language models: end the
    # output where one of these strings appears (it is not included)

    def validate(self) -> None:
        if self.max_len_a < 0 or self.max_len_b < 0:
            raise ValueError(f"max_len_a ({self.max_len_a}) and max_len_b ({self.max_len_b}) "
                             "must be >= 0")
        check_beam(self.beam, self.n_best, self.length_penalty)
        if self.temperature < 0 or self.top_k < 0 or not 0 < self.top_p <= 1:
            raise ValueError(f"need temperature ({self.temperature}) >= 0, top_k "
                             f"({self.top_k}) >= 0 and 0 < top_p ({self.top_p}) <= 1")
        if not 1 <= self.max_new_tokens <= MAX_NEW_TOKENS:
            raise ValueError(f"max_new_tokens ({self.max_new_tokens}) must be in "
                             f"[1, {MAX_NEW_TOKENS:,}]")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty ({self.repetition_penalty}) must be positive")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be in [-2, 2]")
        if self.no_repeat_ngram_size < 0 or self.min_length < 0:
            raise ValueError(f"no_repeat_ngram_size ({self.no_repeat_ngram_size}) and "
                             f"min_length ({self.min_length}) must be >= 0")
        if any(not s for s in self.stop) or len(self.stop) > 8:
            raise ValueError(f"stop ({list(self.stop)}) must be at most 8 non-empty strings")


def check_beam(beam: int, n_best: int, length_penalty: float) -> None:
    """The beam-search settings' one check (``[decode]`` and ``generation.beam_search``)."""
    if beam < 1 or not 1 <= n_best <= beam:
        raise ValueError(f"need beam ({beam}) >= 1 and 1 <= n_best ({n_best}) <= beam")
    if beam > MAX_BEAM:
        raise ValueError(f"beam ({beam}) must be at most {MAX_BEAM}")
    if length_penalty < 0:
        raise ValueError(f"length penalty alpha ({length_penalty}) must be >= 0")
