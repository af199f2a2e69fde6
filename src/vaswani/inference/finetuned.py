"""A LoRA run loaded for use: its ``[train] init_from`` run's weights with its adapters
merged in (nn/lora.py ``merged``), so that it decodes and quantizes as any run."""

from __future__ import annotations

from pathlib import Path

from torch import nn

from .. import checkpoint, rundir
from ..config import RunConfig
from ..models import build_model
from ..models.finetune import add_adapters, check_base, new_parts
from ..nn.lora import merge_lora


def adapted(run_dir: Path, config: RunConfig, adapters: Path, *, fast: bool,
            merge: bool = True) -> nn.Module:
    """The model of a LoRA run: the base weights, then the adapters of ``adapters`` (a
    weights file of the run), merged into them unless ``merge`` is False."""
    fresh = new_parts(config.model)  # a classifier's own head
    model = build_model(config.model, initialise=False, fast=fast)
    base = check_base(Path(config.train.init_from) / rundir.BEST, config.finetune, run_dir)
    checkpoint.load_weights(model, base, fresh=fresh)
    add_adapters(model, config.finetune, trainable=fresh)
    checkpoint.load_weights(model, adapters)
    return merge_lora(model) if merge else model
