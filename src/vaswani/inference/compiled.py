"""A run's decode step compiled ahead of time (engine/compiled.py says what and why):
``vaswani compile RUN`` builds it into the run directory (:func:`compile_run`), and
``vaswani.load`` finds it there (base.py :func:`compiled_step`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from .. import checkpoint, rundir
from ..atomic import file_sha256
from ..config.family import family
from ..engine.build import build, written
from ..engine.compiled import progress
from ..engine.package import identity, package_path
from ..models import EncoderDecoder
from .base import load


def compile_run(run_dir: str | Path, *, quantize: str | None = None, weights: str = "best",
                say: Callable[[str], None] = progress, kv_cache: str | None = None
                ) -> tuple[Path, float]:
    """Build ``run_dir``'s decode step for this machine (and ``quantize``, over a
    ``kv_cache`` cache: base.py ``load``) into
    ``run_dir/compiled/``, replacing one built before; returns the package and the seconds
    the build took. The run is locked while it is written (as training locks it)."""
    run_dir = Path(run_dir)
    if quantize and family(rundir.read_config(run_dir).model.arch).cross:
        raise ValueError(f"{run_dir} holds a translator, whose --quantize int8 layers scale "
                         "their inputs at every call (fbgemm's dynamic kernel), which "
                         "torch.export cannot trace: compile its float step (no --quantize)")
    run = load(run_dir, quantize=quantize, weights=weights, compiled=False, kv_cache=kv_cache)
    if not run.decodes:
        raise ValueError(f"{run_dir} holds {run.describes}, which decodes nothing: there is "
                         "no decode step to compile")
    path = checkpoint.weights_path(run_dir, weights)
    record = {**identity(run_dir, path, quantize, kv_cache), "weights_sha256": file_sha256(path)}
    out = package_path(run_dir, quantize, kv_cache)
    seq2seq = isinstance(run.model, EncoderDecoder)
    with rundir.locked(run_dir):
        rundir.record(run_dir, *(p.relative_to(run_dir).as_posix()
                                 for p in written(out, quantize, seq2seq)),
                      rundir.COMPILED_LIBRARIES)
        seconds = build(run.model, seq2seq, out, record, say, quantize, kv_cache)
    return out, seconds
