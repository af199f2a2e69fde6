"""Using a trained run from Python: ``vaswani.load(RUN_DIR)``.

    >>> run = vaswani.load("runs/copy")           # a Translator: the run's task decides
    >>> run.translate(["abcde"], beam=4)
    ['abcde']

The class depends on the run's task: :class:`Translator` (``translate``), :class:`LanguageModel`
(``generate``) or :class:`Encoder` (``classify``, ``embed``); every run can ``evaluate``,
``attention`` and ``attention_view`` (base.py). Decoding options left out come from the run's
``[decode]`` section and are checked there, so a bad value fails with the field named. Inputs
longer than the model's ``max_len`` are truncated with a warning naming the limit.
``load(DIR, engine="ct2")`` runs a CTranslate2 export of a run (ct2.py) with the same methods.
"""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

from .base import Run, WrongModel
from .base import load as _load_run

for _module in pkgutil.iter_modules(__path__):  # every use class registers itself
    importlib.import_module(f"{__name__}.{_module.name}")

from .encoder import Encoder  # noqa: E402  (imported above; named for the API)
from .language_model import LanguageModel  # noqa: E402
from .translator import Translator  # noqa: E402

ENGINES = ("vaswani", "ct2")


def load(run_dir: str | Path, *, device: str = "cpu", weights: str = "best",
         engine: str = "vaswani", quantize: str | None = None, compiled: bool | None = None,
         kv_cache: str | None = None, fast_prefill: bool | None = None, workers: int = 1):
    """Load a run directory written by ``vaswani train`` (or ``vaswani import``) as the class
    of its task. ``weights``: ``"best"`` (model.safetensors), ``"last"`` (the latest
    checkpoint) or ``"averaged"`` (averaged.safetensors, from ``vaswani average``).
    ``engine="ct2"``: ``run_dir`` is a CTranslate2 export, run by CTranslate2.
    ``quantize="int8"``: the linear layers with int8 weights, on a CPU (cpu/quantized.py).
    ``compiled``: decode with the step ``vaswani compile`` built for the run on this machine
    (None: where there is one; False: eagerly; True: it must be there).
    ``kv_cache="bf16"``: the decoder's keys and values kept in bfloat16 (half the memory).
    ``fast_prefill``: an int8 language model's prompts multiplied in bfloat16, where the CPU
    has bfloat16 products (None, the default: wherever it does; False: never; base.py
    ``load``). ``workers``: a translator's offline calls split across this many processes,
    each with its own copy of the run and an equal share of the threads (workers.py)."""
    if engine == "ct2":
        if workers != 1:
            raise ValueError("workers is vaswani's own engine's; CTranslate2 runs its own "
                             "(its inter_threads)")
        if fast_prefill:
            raise ValueError("--fast-prefill is vaswani's own engine's; CTranslate2 runs its "
                             "own products")
        if quantize:
            raise ValueError("--quantize is vaswani's own; a CTranslate2 export is quantized "
                             "when it is made: vaswani export RUN_DIR --format ct2 --quantize "
                             "int8")
        from .ct2 import load as load_ct2

        return load_ct2(run_dir, device=device)
    if engine != "vaswani":
        raise ValueError(f"engine ({engine!r}) must be one of {', '.join(ENGINES)}")
    return _load_run(run_dir, device=device, weights=weights, quantize=quantize,
                     compiled=compiled, kv_cache=kv_cache, fast_prefill=fast_prefill,
                     workers=workers)


__all__ = ["Encoder", "LanguageModel", "Run", "Translator", "WrongModel", "load"]
