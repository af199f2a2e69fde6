"""What differs between the three kinds of model during training: how a batch is made, how
its loss is computed, and which task metric is reported.

Each task turns global micro-batch ``i`` into this rank's share of it (see data/batching.py),
computes ``(smoothed loss sum, NLL sum, target count)`` for a batch, and evaluates on the
validation data. Counts are what the loop normalises by: non-padding target tokens for
translation and language modelling, examples for classification.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor, nn

from ..data.batching import (
    BatchPlan,
    lm_eval_windows,
    lm_windows,
    pad,
    shard,
    token_budget_batches,
)
from ..data.datasets import Dataset
from ..data.tokenizers import BOS_ID, EOS_ID, PAD_ID
from ..evaluation.metrics import bleu_chrf, exact_match
from ..generation.greedy import greedy_decode
from .losses import smoothed_cross_entropy

Batch = dict[str, Tensor]


class Task:
    metrics: tuple[str, ...] = ("valid_loss",)  # what [train] best_metric may name

    def __init__(self, ds: Dataset, cfg, rank: int, world: int, device: torch.device) -> None:
        self.ds, self.cfg = ds, cfg
        self.rank, self.world, self.device = rank, world, device

    def to_device(self, batch: Batch) -> Batch:
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def micro_batch(self, i: int) -> Batch:
        raise NotImplementedError

    def loss(self, model: nn.Module, batch: Batch, smoothing: float):
        raise NotImplementedError

    def valid_batches(self) -> Iterator[Batch]:
        raise NotImplementedError

    @torch.no_grad()
    def metric(self, model: nn.Module, n_examples: int) -> dict:
        return {}


class _BucketedTask(Task):
    """Tasks whose examples are token lists batched under a token budget."""

    def __init__(self, ds, cfg, rank, world, device) -> None:
        super().__init__(ds, cfg, rank, world, device)
        budget = cfg.data.max_tokens
        self.plan = BatchPlan(token_budget_batches(self.lengths(ds.train), budget, world),
                              cfg.train.seed)
        self.valid_plan = token_budget_batches(self.lengths(ds.valid), budget)

    def lengths(self, examples) -> list[int]:
        raise NotImplementedError

    def collate(self, examples) -> Batch:
        raise NotImplementedError

    def micro_batch(self, i: int) -> Batch:
        examples = [self.ds.train[j] for j in shard(self.plan.indices(i), self.rank, self.world)]
        return self.to_device(self.collate(examples))

    def valid_batches(self) -> Iterator[Batch]:
        for idx in self.valid_plan:
            yield self.to_device(self.collate([self.ds.valid[j] for j in idx]))


class TranslationTask(_BucketedTask):
    metrics = ("valid_loss", "exact_match", "bleu", "chrf")

    def lengths(self, examples):
        return [max(len(s), len(t)) for s, t in examples]

    def collate(self, examples) -> Batch:
        return {"src": pad([s for s, _ in examples]), "tgt": pad([t for _, t in examples])}

    def loss(self, model, batch, smoothing):
        tgt = batch["tgt"]
        logits = model(batch["src"], tgt[:, :-1])  # teacher forcing: read tgt[:-1] and
        return smoothed_cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(),  # predict tgt[1:]
                                      smoothing=smoothing, pad_id=PAD_ID)

    @torch.no_grad()
    def metric(self, model, n_examples):
        pairs = self.ds.raw_valid[:n_examples]
        if not pairs:
            return {}
        hyps = []
        for start in range(0, len(pairs), 64):
            chunk = pairs[start: start + 64]
            src = pad([self.ds.valid[start + j][0] for j in range(len(chunk))]).to(self.device)
            out = greedy_decode(model, src, bos_id=BOS_ID, eos_id=EOS_ID,
                                max_len_a=self.cfg.decode.max_len_a,
                                max_len_b=self.cfg.decode.max_len_b)
            hyps.extend(self.ds.target_tokenizer.decode(ids) for ids in out)
        refs = [t for _, t in pairs]
        scores = bleu_chrf(hyps, refs)
        return {"exact_match": exact_match(hyps, refs), "bleu": scores["bleu"],
                "chrf": scores["chrf"]}


class ClassificationTask(_BucketedTask):
    metrics = ("valid_loss", "accuracy")

    def lengths(self, examples):
        return [len(ids) for ids, _ in examples]

    def collate(self, examples) -> Batch:
        return {"ids": pad([ids for ids, _ in examples]),
                "label": torch.tensor([label for _, label in examples])}

    def loss(self, model, batch, smoothing):
        return smoothed_cross_entropy(model(batch["ids"]), batch["label"], smoothing=smoothing)

    @torch.no_grad()
    def metric(self, model, n_examples):
        correct = total = 0
        for batch in self.valid_batches():
            correct += int((model(batch["ids"]).argmax(-1) == batch["label"]).sum())
            total += batch["label"].numel()
        return {"accuracy": correct / max(1, total)}


class LanguageModelTask(Task):
    def micro_batch(self, i: int) -> Batch:
        d = self.cfg.data
        x, y = lm_windows(self.ds.train, i, self.cfg.train.seed, d.batch_size, d.block_size)
        return self.to_device({"input": shard(x, self.rank, self.world),
                               "target": shard(y, self.rank, self.world)})

    def loss(self, model, batch, smoothing):
        x = batch["input"]
        logits = model(x, mask=torch.ones_like(x, dtype=torch.bool))  # text has no padding
        return smoothed_cross_entropy(logits.flatten(0, 1), batch["target"].flatten(),
                                      smoothing=smoothing)

    def valid_batches(self) -> Iterator[Batch]:
        windows = lm_eval_windows(self.ds.valid, self.cfg.data.block_size)
        size = self.cfg.data.batch_size
        for start in range(0, len(windows), size):
            group = windows[start: start + size]
            full = [w for w in group if w[0].size(1) == group[0][0].size(1)]
            rest = [w for w in group if w[0].size(1) != group[0][0].size(1)]
            for chunk in (full, rest):
                if chunk:
                    yield self.to_device({"input": torch.cat([x for x, _ in chunk]),
                                          "target": torch.cat([y for _, y in chunk])})


TASK_CLASSES = {"translation": TranslationTask, "classification": ClassificationTask,
                "lm": LanguageModelTask}


def make_task(ds: Dataset, cfg, rank: int, world: int, device: torch.device) -> Task:
    return TASK_CLASSES[ds.task](ds, cfg, rank, world, device)
