"""Loading several runs at once (``vaswani serve``), LoRA runs of one base on one copy of it.

Loaded alone, a LoRA run is its base's weights with its adapters merged in (finetuned.py).
Served beside other LoRA runs of the same base, or beside the base run itself, each would
then hold a whole merged copy of the base. :func:`load_runs` loads the base once and gives
each of those runs its adapters on it (engine/adapters.py): every run keeps its own name,
config, tokenizer and chat template, and a request computes with its run's adapter, in the
same batches as the others'. A run's outputs are those of its merged model within float
rounding (the update is added to the base layer's output rather than to its weight).

Only language models share a base so: a LoRA translator or classifier is loaded merged, as
alone.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

from .. import checkpoint, rundir
from ..config import RunConfig
from ..config.family import family
from ..engine.adapters import attach
from ..models.finetune import add_adapters, check_base
from ..nn.lora import remove_lora
from .base import Run, load


def load_runs(run_dirs: dict[str, str | Path], *, weights: str = "best",
              compiled: bool | None = None, say: Callable[[str], None] | None = None,
              **options) -> dict[str, Run]:
    """Each of ``run_dirs`` (model name -> run directory) loaded as :func:`load` loads it,
    but that language-model LoRA runs of one base, two or more of them or with the base
    among ``run_dirs``, share one copy of the base (the module says how). ``options``:
    :func:`load`'s (device, quantize). ``say``: told which runs share a base."""
    configs = {name: rundir.read_config(Path(d)) for name, d in run_dirs.items()}
    groups: dict[Path, list[str]] = {}  # a base's weights -> the LoRA runs on it
    for name, config in configs.items():
        if config.finetune.lora and family(config.model.arch).language_model:
            groups.setdefault(base_of(config), []).append(name)
    runs: dict[str, Run] = {}
    for base, names in groups.items():
        bases = [name for name, d in run_dirs.items() if name not in names
                 and checkpoint.weights_path(Path(d), weights).resolve() == base]
        if len(names) + len(bases) < 2:
            continue  # one LoRA run alone: merged, as load() gives it
        if compiled:
            raise ValueError(f"{', '.join(names)} share the base {base.parent}, whose layers "
                             "then compute each request with its own adapter: they decode "
                             "eagerly, with no compiled step (do not ask for compiled=True)")
        base_run = load(base.parent, compiled=False, **options)
        adapted = {name: Path(run_dirs[name]) for name in names}
        attach_runs(base_run, adapted, configs, weights)
        for k, name in enumerate(names, 1):
            runs[name] = view(base_run, adapted[name], configs[name], k)
        for name in bases:
            runs[name] = base_run if name == bases[0] else view(
                base_run, Path(run_dirs[name]), configs[name], 0)
        if say is not None:
            say(f"{', '.join(names)}: LoRA adapters over one copy of {base.parent}"
                + (f" (served as {', '.join(bases)})" if bases else ""))
    return {name: runs.get(name) or load(d, weights=weights, compiled=compiled, **options)
            for name, d in run_dirs.items()}


def base_of(config: RunConfig) -> Path:
    """The weights file a LoRA run's adapters were trained on."""
    return (Path(config.train.init_from) / rundir.BEST).resolve()


def attach_runs(base_run: Run, run_dirs: dict[str, Path], configs: dict[str, RunConfig],
                weights: str) -> None:
    """Each LoRA run's adapters read onto ``base_run``'s model, as adapter 1, 2, ... in the
    order of ``run_dirs`` (engine/adapters.py ``attach``), each checked against the base's
    weights (its tokenizer: :func:`view`)."""
    model, taken = base_run.model, []
    for name, run_dir in run_dirs.items():
        config = configs[name]
        check_base(base_of(config), config.finetune, run_dir)
        add_adapters(model, config.finetune)  # this run's LoRA layers on the base's ...
        checkpoint.load_weights(model, checkpoint.weights_path(run_dir, weights))
        taken.append(remove_lora(model))  # ... taken off again, holding its adapters
    attach(model, taken)
    model.eval()


def view(base_run: Run, run_dir: Path, config: RunConfig, adapter: int) -> Run:
    """A run of its own (name, config, chat template, offline engine) over ``base_run``'s
    model, computing with adapter ``adapter`` of it; its tokenizer must have the base's
    vocabulary size."""
    run = copy.copy(base_run)
    run.run_dir, run.config, run.adapter = run_dir, config, adapter
    run.source_tokenizer, run.target_tokenizer, run.labels = rundir.read_tokenizers(run_dir)
    size, base_size = run.source_tokenizer.vocab_size, base_run.source_tokenizer.vocab_size
    if size != base_size:
        raise ValueError(f"{run_dir}'s tokenizer has {size} tokens, its base's {base_size}")
    run.chat_template = rundir.read_chat_template(run_dir)
    run._engine = None  # (an offline call's engine: its own)
    return run
