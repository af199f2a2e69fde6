"""A task: what one kind of model learns from, and how it is trained.

vaswani has three, one per model architecture, each in its own file:

    translation      encoder-decoder   tasks/translation.py
    lm               decoder           tasks/language_model.py
    classification   encoder           tasks/classification.py

A task registers itself by being defined: a subclass names itself (``name``) and the
architecture it trains (``arch``). A config gets its ``[model] arch``'s task (the family's
record, config/family.py), and any other task is chosen with ``[data] task = "NAME"``. Every
module in this folder is imported by ``tasks/__init__.py``, so a new task is one new file.
Using a trained model (translating, generating, classifying) is not a task's business: that is
the use classes' in inference/.

Everything that differs between tasks in data and training lives in its class, in the order a
run meets it:

1. data: :meth:`Task.iter_examples` streams a split's files as examples (or, for text,
   pieces of it), :meth:`Task.train_tokenizers_from` trains the tokenizers on (a sample of) the
   training examples, :meth:`Task.encode_examples` writes their token ids (the token layout:
   which specials go where); data/encode.py holds out the validation set and keeps the
   encoded data in memory-mapped files, cached (:meth:`Task.load`);
2. training: :meth:`Task.model_fields` (what the data decides in ``[model]``),
   :meth:`Task.batches` (global batch i -> this rank's share), :meth:`Task.loss` (the shape of
   a recipe's loss step: the forward pass and the loss of one batch; its ``collate`` counts
   what the loss is normalised by), :meth:`Task.metric` (the validation metric named by
   ``[train] best_metric``).

The training loop and the CLI ask the task and never test which task it is.

Special token ids (pad, bos, eos) come from the tokenizers, and ``[model] pad_id`` is set from
the source tokenizer when a run starts: nothing assumes that padding is id 0.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import torch
from torch import Tensor, nn

from ..config import RunConfig
from ..config.family import family
from ..data import encode
from ..data.batching import Batch
from ..data.encode import TaskData
from ..data.files import ReadReport
from ..data.tokenizers import Tokenizer
from ..models import head_loss, losses


def task_for(config: RunConfig) -> Task:
    """The task of a run: ``[data] task``, else the task of its ``[model] arch``; built with
    the run's config."""
    name = config.data.task
    if not name:
        return family(config.model.arch).task(config)
    if name not in Task.registry:
        raise ValueError(f"[data] task ({name!r}) must be one of "
                         f"{', '.join(sorted(Task.registry))}")
    task = Task.registry[name]
    if task.arch != config.model.arch:
        raise ValueError(f"[data] task {name!r} trains [model] arch {task.arch!r}, not "
                         f"{config.model.arch!r}")
    return task(config)


class Task:
    """The interface every task implements; the docstring of this module says what each
    method is for. Built with the run's config (after ``vaswani train`` has filled in what
    the data decides: vocabulary sizes and ``pad_id``)."""

    name: ClassVar[str]  # "translation", "lm", "classification": what a registry dataset is for
    arch: ClassVar[str]  # the model architecture it trains ([model] arch)
    metrics: ClassVar[tuple[str, ...]] = ("valid_loss",)  # what [train] best_metric may name
    unit: ClassVar[str] = "examples"  # what len(TaskData.train) counts
    labelled: ClassVar[bool] = False  # examples carry class labels (kept in the run's tokenizer/)

    registry: ClassVar[dict[str, type[Task]]] = {}  # name -> task

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if "name" in cls.__dict__:
            Task.registry[cls.name] = cls

    def __init__(self, config: RunConfig) -> None:
        self.config = config
        self.pad_id = config.model.pad_id

    def micro_batch_tokens(self) -> int:
        """Tokens of one micro-batch at most (padding included)."""
        return self.config.data.max_tokens

    def check_training_config(self) -> None:
        """What training this task needs of the config, checked before a run directory is
        touched (a ValueError naming the fields)."""
        best = self.config.train.best_metric
        if best not in self.metrics:
            raise ValueError(f"best_metric ({best!r}) must be one of {list(self.metrics)} "
                             "for this task")

    # --- 1. data -------------------------------------------------------------------------
    FIELDS: ClassVar[dict[str, str]] = {}  # encoded fields: "ragged", "labels" or "stream"

    def load(self, cache: Path, tokenizers: tuple[Tokenizer, Tokenizer | None] | None = None,
             labels: list[str] | None = None, *, progress: bool = True) -> TaskData:
        """The run's data: the ``[data]`` files read, a validation set held out, the
        tokenizers trained (unless given, as when resuming), everything encoded into memory
        maps, once: later calls with the same inputs map the same files (data/encode.py)."""
        return encode.load(self, cache, tokenizers, labels, progress=progress)

    def iter_examples(self, paths: list[str], report: ReadReport) -> Iterator:
        """The examples (for text: the lines) of ``paths``, in a stream; bad lines are
        reported with file:line."""
        raise NotImplementedError

    def read(self, paths: list[str], report: ReadReport):
        """The examples of ``paths`` in memory (what ``vaswani evaluate`` scores)."""
        return list(self.iter_examples(paths, report))

    def encoding_options(self) -> dict:
        """What, beside the files, the tokenizer and the ``[data]`` options every task's
        encoding depends on (data/encode.py), decides this task's encoded data."""
        return {}

    def train_tokenizers_from(self, inputs, kind: str) -> tuple[Tokenizer, Tokenizer | None]:
        """(source, target) tokenizers trained on (a sample of) the training data;
        ``inputs`` is a :class:`~vaswani.data.encode.Inputs` (``inputs.train_examples()``
        streams them). Target is None for one-sided tasks."""
        raise NotImplementedError

    def train_labels(self, inputs) -> list[str]:
        """The sorted class labels of the training examples (held-out ones excluded): asked
        of a ``labelled`` task."""
        raise NotImplementedError

    def encode_examples(self, examples: list, tokenizers, writer, ctx: dict) -> None:
        """Write a batch of examples' token ids (the token layout) to an encoded ``writer``;
        ``ctx["truncated"]`` counts sequences cut to max_len."""
        raise NotImplementedError

    # --- 2. training ---------------------------------------------------------------------
    def model_fields(self, data: TaskData) -> dict:
        """``[model]`` values the data decides."""
        return {"vocab_size": data.source_tokenizer.vocab_size,
                "pad_id": data.source_tokenizer.pad_id}

    def batches(self, data: TaskData, rank: int, world: int):
        """An object with ``micro_batch(i) -> Batch`` (this rank's share of global batch i, a
        pure function of i and the seed) and ``valid_batches() -> Iterator[Batch]``."""
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch, smoothing: float
             ) -> tuple[Tensor, Tensor, Tensor]:
        """(smoothed loss sum, NLL sum, number of targets) of one batch."""
        raise NotImplementedError

    def criterion(self, logits: Tensor, target: Tensor, *, smoothing: float = 0.0,
                  pad_id: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """The label-smoothed cross-entropy of ``logits`` (models/losses.py), compiled where
        the run compiles its training step (``[train] compile`` on the logits' device)."""
        compiled = self.config.train.compiles(logits.device)
        loss = losses.compiled_smoothed_cross_entropy if compiled else \
            losses.smoothed_cross_entropy
        return loss(logits, target, smoothing=smoothing, pad_id=pad_id)

    def next_token_loss(self, model: nn.Module, ids: Tensor, target: Tensor, *,
                        smoothing: float = 0.0, pad_id: int | None = None
                        ) -> tuple[Tensor, Tensor, Tensor]:
        """A decoder-only ``model``'s loss predicting ``target`` (B, T) from ``ids`` (B, T)
        (causal attention alone: no padding before a real token). On a CPU, compiled or not,
        the vocabulary projection and the loss run together, chunk by chunk, so the (B, T, V)
        logits never exist (head_loss.head_cross_entropy); elsewhere the logits are made and
        :meth:`criterion` takes them."""
        target = target.flatten()
        if ids.device.type == "cpu":
            loss, nll, n = model(ids, mask=True, loss=functools.partial(
                head_loss.head_cross_entropy, target=target, smoothing=smoothing, pad_id=pad_id))
        else:
            logits = model(ids, mask=True)
            loss, nll, n = self.criterion(logits.flatten(0, 1), target, smoothing=smoothing,
                                          pad_id=pad_id)
        experts = self.config.model.experts
        weight = experts.aux_loss if experts.count else 0.0
        balance = losses.router_loss(model, None if pad_id is None else ids != pad_id) \
            if weight else None
        if balance is not None:  # a mixture of experts' load balancing, per target counted
            loss = loss + weight * balance * n
        return loss, nll, n

    @torch.no_grad()
    def metric(self, model: nn.Module, data: TaskData, batches, n_examples: int,
               device: torch.device) -> dict:
        """The task's validation metrics on up to ``n_examples`` examples (``batches``: what
        :meth:`batches` returned for this run)."""
        return {}
