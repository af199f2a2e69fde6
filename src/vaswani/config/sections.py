"""The run's other sections: ``[data]``, ``[train]`` and ``[decode]`` (``[model]`` is
model.py). Frozen, validated dataclasses that round-trip through dict and TOML, as there;
each field's docstring is its documentation.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Literal

from .base import ConfigBase

MAX_SPECULATE = 32  # tokens guessed per pass at most: past it, a pass costs its tokens
MAX_BEAM = 128  # wider beams cost memory and time and rarely help
MAX_NEW_TOKENS = 100_000
MAX_SEED = 2**63 - 1  # the largest seed a torch.Generator takes
MAX_VOCAB = 1 << 24  # tokens in a vocabulary at most (16.7 million)


@dataclass(frozen=True)
class DataConfig(ConfigBase):
    """Where the examples come from and how they are tokenised and batched (``[data]``).

    ``dataset`` names a built-in dataset (``copy``) or a prepared one; otherwise ``train``
    lists files: one TSV/CSV/JSONL file, two aligned plain-text files (source, target) for
    translation, or any number of text files (globs allowed) for language modelling.
    Without ``valid`` files, ``valid_fraction`` of the training examples is held out by seed.
    """

    SECTION = "data"

    task: str | None = None
    """What the data is for: a task's name ("translation", "lm", "classification", "chat"
    (conversations, the loss on the answers), or one of your own); None = the task of the
    [model] arch."""
    dataset: str = ""
    """A built-in or prepared dataset (`vaswani data list`); empty = the files in
    `train`."""
    train: list[str] = dataclasses.field(default_factory=list)
    """Training files: one TSV/CSV/JSONL file, two aligned text files (translation), or
    text files (globs allowed) for language modelling."""
    valid: list[str] = dataclasses.field(default_factory=list)
    """Validation files, in the same form; none = hold out `valid_fraction` of `train`."""
    test: list[str] = dataclasses.field(default_factory=list)
    """Test files, for `vaswani evaluate --split test`."""
    format: Literal["auto", "tsv", "csv", "jsonl", "text", "aligned"] = "auto"
    """How to read the files; "auto" decides from the task and the file extension."""
    valid_fraction: float = 0.05
    """Share of the training examples held out for validation when no `valid` files are
    given."""
    split_seed: int = 0
    """Seed of that hold-out split."""
    tokenizer: Literal["char", "bpe"] = "bpe"
    """Tokenizer to train on the data: "char" (one token per character) or "bpe" (byte-
    level BPE)."""
    vocab_size: int = 8000
    """BPE vocabulary size; the char vocabulary is whatever the text holds."""
    shared_vocab: bool = True
    """Translation: one tokenizer for source and target (else one each)."""
    max_tokens: int = 4096
    """Token budget of one (micro-)batch, padding included."""
    batch_tokens: int = 0
    """Tokens per optimizer step, all micro-batches and processes together, as the paper
    counts its batches (~25,000): [train] grad_accum follows from it and the micro-batch
    (max_tokens; a language model's batch_size x block_size) when a run starts. 0: off."""
    batch_size: int = 32
    """Language modelling: windows per batch."""
    block_size: int = 256
    """Language modelling: tokens per window."""
    pad_to_multiple: int = 0
    """Pairs and labelled texts: pad each batch's length up to a multiple of this (0: to
    its longest): fewer shapes for torch.compile, aligned GPU matmuls."""
    max_skip: int = 0
    """Bad lines to skip (counted and reported) before failing."""
    tokenizer_sample: int = 20_000_000
    """Bytes of training data the tokenizer learns from at most: a larger training set
    gives a seeded random sample of whole examples (or lines)."""

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
        if self.vocab_size > MAX_VOCAB:
            raise ValueError(f"vocab_size ({self.vocab_size}) must be at most {MAX_VOCAB:,}")
        if not 0 <= self.split_seed <= MAX_SEED:
            raise ValueError(f"split_seed ({self.split_seed}) must be in [0, 2**63 - 1]")
        for name in ("max_skip", "pad_to_multiple", "batch_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")


@dataclass(frozen=True)
class TrainConfig(ConfigBase):
    """The optimisation and the bookkeeping around it (``[train]``)."""

    SECTION = "train"

    max_steps: int = 1000
    """Optimizer steps to train for."""
    schedule_steps: int | None = None
    """The learning-rate schedule's length; None = `max_steps` (fixed when a run starts, so that
    resuming with a larger max_steps continues the same schedule)."""
    max_minutes: float = 0.0
    """Wall-clock budget: stop, evaluate and save when spent (0 = off)."""
    seed: int = 0
    """Seed of initialisation, batching and dropout: the same seed, data and config give
    the same run."""
    lr: float = 5e-4
    """Peak learning rate."""
    schedule: Literal["noam", "cosine", "constant", "wsd"] = "cosine"
    """Learning-rate schedule after the warm-up: "noam" (the paper's inverse square
    root), "cosine", "constant", or "wsd" (constant, then a straight line down to `min_lr`
    over the last `cooldown` of the steps)."""
    warmup: int = 100
    """Optimizer steps of linear warmup."""
    min_lr: float = 0.0
    """The floor the cosine and wsd schedules end at."""
    cooldown: float = 0.3
    """The wsd schedule's decay: the last fraction of the steps (0-1], over which the rate
    falls in a straight line to `min_lr`."""
    optimizer: Literal["adamw", "muon"] = "adamw"
    """"adamw": AdamW for every parameter. "muon": Muon (`torch.optim.Muon`'s step; its
    Newton-Schulz iteration in bf16 where the device has native bf16, float32 elsewhere) for
    the transformer layers' weight matrices, at `muon_lr`, and AdamW for the embeddings, the
    output head, norms and biases, at `lr` (both follow the schedule)."""
    muon_lr: float = 0.02
    """Muon's peak learning rate (optimizer = "muon"); scaled by the schedule as `lr` is.
    Sensitive: on the demo 0.01-0.02 were within a BLEU, 0.03 lost 5 (docs/results.md)."""
    muon_momentum: float = 0.95
    """Muon's momentum (Nesterov)."""
    weight_decay: float = 0.01
    """Decoupled weight decay, on every parameter of two or more dimensions (matrices and
    embeddings; Muon's matrices too); biases and norms are not decayed."""
    beta1: float = 0.9
    """AdamW's first-moment decay."""
    beta2: float = 0.98
    """AdamW's second-moment decay (0.98 as in the paper)."""
    label_smoothing: float = 0.0
    """Label smoothing epsilon (the paper uses 0.1); padding is ignored in the target
    distribution and the token count."""
    clip_norm: float = 1.0
    """Clip the gradient's global norm to this; 0 disables clipping."""
    max_skipped_steps: int = 10
    """Steps with a non-finite loss or gradient update nothing; more than this many in a
    row stop the run (the last checkpoint is kept)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Autocast: bf16 (CUDA since Ampere, CPUs with AMX or AVX512-BF16), fp16 with a
    gradient scaler (GPUs without fast bf16)."""
    bf16: bool = False
    """Older name for `precision = "bf16"` (config.toml keeps both in step)."""
    compile: bool | Literal["auto"] = "auto"
    """Compile the model with `torch.compile`: true, false, or "auto": on a GPU, where a
    step of many small kernels is bound by their launches and compiling fuses them, not on
    a CPU, where a translator's compiled step was slower than the eager one; a LoRA step
    of a language model on a CPU gains about a tenth compiled, after its first step
    compiles for a minute or two in each process (docs/performance.md). A run directory
    loads the same either way."""
    parallel: Literal["ddp", "fsdp"] = "ddp"
    """Several processes (torchrun): "ddp" keeps the whole model, gradients and optimizer
    on every rank; "fsdp" shards them over the ranks, each transformer layer a unit
    (docs/distributed.md)."""
    checkpoint_activations: bool = False
    """Recompute each layer's activations in the backward pass instead of keeping them:
    less memory, about a third more compute; same gradients."""
    collective_timeout: float = 300.0
    """Several processes: seconds a training step's exchange (gradients, counts) waits
    for the other ranks before giving up with an error (a rank that hangs without
    dying); waiting for rank 0's work alone (data, evaluation, saving) is not limited
    by it."""
    tensorboard: bool = False
    """TensorBoard event files in RUN_DIR/tensorboard/ (rank 0)."""
    init_from: str = ""
    """A run directory (e.g. from `vaswani import`) to start from: its [model], tokenizer
    and weights are used; a new classification head is initialised."""
    device: str = "auto"
    """Where to train: "auto" (a GPU if there is one), "cpu", "cuda", "cuda:1", ..."""
    log_every: int = 10
    """Optimizer steps between lines of `metrics.jsonl`."""
    eval_every: int = 200
    """Optimizer steps between evaluations on the validation data."""
    eval_batches: int = 50
    """Validation batches per evaluation; 0 = the whole validation set."""
    metric_examples: int = 200
    """Examples decoded for the task metric (0 = off)."""
    save_every: int = 200
    """Optimizer steps between checkpoints (`last/`)."""
    keep_checkpoints: int = 0
    """Keep the weights of the last N checkpoints (checkpoints/) and write their average
    (averaged.safetensors) when training ends; 0 = off."""
    best_metric: str = "valid_loss"
    """What picks the best weights (model.safetensors): "valid_loss", or a task metric:
    exact_match, bleu, chrf (translation), accuracy (classification)."""
    patience: int = 0
    """Early stopping: evaluations without improvement (0 = off)."""

    def compiles(self, device) -> bool:
        """Whether training on ``device`` compiles the model (``compile``)."""
        return self.compile is True or (self.compile == "auto" and device.type == "cuda")

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
        if self.muon_lr <= 0:
            raise ValueError(f"muon_lr ({self.muon_lr}) must be positive")
        for name in ("beta1", "beta2", "muon_momentum"):
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
        if not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed ({self.seed}) must be in [0, 2**63 - 1]")
        for name in ("warmup", "patience", "eval_batches", "metric_examples", "max_skipped_steps",
                     "keep_checkpoints"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} ({getattr(self, name)}) must be >= 0")
        if self.schedule == "noam" and self.warmup == 0:
            raise ValueError("warmup (0) must be positive for the noam schedule")
        if not 0.0 < self.cooldown <= 1.0:
            raise ValueError(f"cooldown ({self.cooldown}) must be in (0, 1]")
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
    """Beam width for translation; 1 = greedy search."""
    n_best: int = 1
    """Hypotheses returned per input, best first (at most `beam`)."""
    length_penalty: float = 0.6
    """GNMT length-normalisation alpha: hypotheses ranked by log P / ((5 + length) / 6)
    ** alpha."""
    max_len_a: float = 1.5
    """Translation length cap: at most `max_len_a * source_length + max_len_b` tokens."""
    max_len_b: int = 10
    """See `max_len_a`."""
    max_new_tokens: int = 200
    """Language models: tokens to generate at most."""
    temperature: float = 1.0
    """Language models: sampling temperature; 0 = greedy."""
    top_k: int = 0
    """Sample among the k most likely tokens only; 0 = off."""
    top_p: float = 1.0
    """Nucleus sampling: among the most likely tokens whose probabilities sum to p; 1 = off."""
    repetition_penalty: float = 1.0
    """> 1 divides a positive score of a token already produced by it and multiplies a
    negative one (CTRL); 1 = off."""
    presence_penalty: float = 0.0
    """OpenAI's: subtracted once from a generated token's score."""
    frequency_penalty: float = 0.0
    """OpenAI's: subtracted per occurrence so far."""
    no_repeat_ngram_size: int = 0
    """Forbid repeating any n-gram of this size (0 = off)."""
    min_length: int = 0
    """Tokens to generate before <eos> may end the output."""
    stop: list[str] = dataclasses.field(default_factory=list)
    """Language models: end the output where one of these strings appears (it is not
    included)."""
    speculate: int = 0
    """Language models: tokens guessed from the context (prompt lookup) after each token
    and checked in its forward pass; the same output, in fewer passes where the text repeats
    its context. 0 = off."""

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
        if not 0 <= self.speculate <= MAX_SPECULATE:
            raise ValueError(f"speculate ({self.speculate}) must be in [0, {MAX_SPECULATE}]")
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
