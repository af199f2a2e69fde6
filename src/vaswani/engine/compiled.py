"""The decode step compiled ahead of time: one AOTInductor package per run, built once
(``vaswani compile RUN``), loaded by every later process in seconds.

Why: a decode step of a small model on a CPU is a few hundred small operators, and eager
PyTorch pays a fixed cost for each (dispatch, an allocation, a Python frame): for
SmolLM2-135M about as much as the matrix products themselves. ``torch.export`` traces the
step into one graph; Inductor fuses the small operators into a few C++ loops, freezes the
weights into constants and multiplies with the kernels pinned for the weights' kind
(build.py ``GEMM``: ATen's, or its own C++ templates); AOTInductor writes the result as a
package (a shared library and the weights) that ``aoti_load_package`` opens without
compiling anything.

What is compiled is the engine's own decode step (step.py ``forward_step``): each of R rows
feeds one token at its position into the slot it names, writes its keys and values into its
column there, and reads the first ``W`` keys of that slot, by index, under a mask of its
position; a translator's rows also read their source slots' ``X`` keys, by index, and come
in runs (``SOURCE_PARTS``) that each read only as many keys as their own longest row and
source. Rows may name one slot: the places of a speculative pass (speculate.py), a row's
token and the tokens guessed after it, are rows of their own in the row's slot, each
writing its keys before any reads them, and each computes what the decoding step at its
place would, bit for bit (the same graph, one token a row). Nothing is reimplemented, so
the compiled step computes what the eager one does: the cache's tensors are the package's
inputs, written in place, and the sizes that change from step to step (rows R, keys read W,
sources' keys X, the cache's slots and width) are dynamic dimensions of one package, not
one package per shape. ``W``, ``X`` and each run's keys come in as the lengths of empty
tensors (a traced graph takes sizes from its inputs' shapes).

A package is bound to what it was built from, and lies in the run beside a record of that
and its shared library unpacked (package.py); loading one that does not match is refused
with a warning that names the difference; the run is then used eagerly, as it is without a
package (``--eager`` says so outright).

A translator's float package has two companions: one built from the same trace with other
matrix products, for its steps of a few rows (build.py ``FEW_GEMM``: the engine calls
whichever its step's rows fall to), and its encoder pass (:class:`EncodeStep`: runner.py
encodes the sources it admits with it). A package loads its companions with it. Here: what
is traced and how a package is loaded and called; build.py builds them.
"""

from __future__ import annotations

import json
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..devices import give_back_freed_memory
from .package import (
    intact,
    matched,
    options,
    package_path,
    record_path,
    unpacked,
)
from .plan import StepPlan
from .step import forward_step
from .tensors import tensor_of
from .views import StepCache

# The most rows a package's step takes (its rows' dynamic size); a step of more runs eagerly.
# Every kind of package is the faster up to there at every size tried: float32 up to the 512
# hypotheses a beam-4 translation decodes together by default, int8 and int4 up to the 312
# rows SmolLM2's offline engine decodes at once (docs/performance.md, "A compiled decode
# step").
ROWS = 1 << 14
# A translator's rows read their sources' keys, and their own, in this many runs of rows,
# each run only as many keys as its longest source (plan.py ``parts``) and its longest row
# (``self_parts``), not every row the step's longest: in a beam search, hypotheses admitted
# as others finish sit beside rows far longer (the engine hands rows in longest first), and
# the attention's time is mostly the reading of keys.
SOURCE_PARTS = 4


@dataclass
class CacheTensors:
    """The engine cache's tensors as the compiled step receives them: what
    :class:`~vaswani.engine.views.StepCache` reads of a :class:`~vaswani.engine.cache.SlotCache`."""

    k: list[Tensor]
    v: list[Tensor]
    ck: list[Tensor]
    cv: list[Tensor]
    compute: torch.dtype  # what the attention reads the keys as (the model's dtype)

    @property
    def seq2seq(self) -> bool:
        return bool(self.ck)

    @property
    def n_layers(self) -> int:
        return len(self.k)

    @property
    def shape(self) -> tuple[int, int]:
        return self.k[0].size(1), self.k[0].size(3)  # key/value heads, head dim

    @property
    def width(self) -> int:
        return self.k[0].size(2)

    def step(self, plan: StepPlan) -> StepCache:
        return StepCache(self, plan)


class DecodeStep(nn.Module):
    """The decode step as a function of tensors only, which ``torch.export`` traces:

    ids, positions, columns (R, 1); slots (R,): the slot each row writes and reads; keys
    (W,) and, for a translator, cross (X,): empty tensors whose lengths are the keys read;
    k, v: the cache's per-layer tensors (slots, Hkv, width, Dh), written in place; sources,
    lengths (R,): each row's source slot and its length; ck, cv: the sources' keys and
    values; part_keys and self_keys: an empty tensor for each run of rows (``SOURCE_PARTS``
    runs, one in a few-row companion: build.py ``FEW_PARTS``), the source keys and the rows'
    own keys each run of R / runs rows reads (R a multiple of it) -> logits (R, V)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, positions: Tensor, columns: Tensor, slots: Tensor,
                keys: Tensor, k: list[Tensor], v: list[Tensor], sources: Tensor | None = None,
                lengths: Tensor | None = None, cross: Tensor | None = None,
                ck: list[Tensor] | None = None, cv: list[Tensor] | None = None,
                part_keys: list[Tensor] | None = None,
                self_keys: list[Tensor] | None = None) -> Tensor:
        cache = CacheTensors(k, v, ck or [], cv or [], next(self.model.parameters()).dtype)
        extra = {}
        if cache.seq2seq:
            size = ids.size(0) // len(part_keys)
            extra = dict(sources=sources, lengths=lengths, cross=cross.size(0),
                         parts=[(i * size, (i + 1) * size, run.size(0))
                                for i, run in enumerate(part_keys)],
                         self_parts=[(i * size, (i + 1) * size, run.size(0))
                                     for i, run in enumerate(self_keys)])
        plan = StepPlan(columns, keys.size(0), slots=slots, **extra)
        last = torch.zeros(ids.size(0), dtype=torch.long, device=ids.device)
        return forward_step(self.model, cache, ids, positions, last, plan)


def encode_sources(model: nn.Module, src: Tensor, lengths: Tensor
                   ) -> list[tuple[Tensor, Tensor]]:
    """A translator's encoder pass: sources src (B, S), padded, of ``lengths`` (B,) tokens
    -> each decoder layer's cross-attention keys and values, (B, Hkv, S, Dh) each (what
    runner.py ``Runner.encode`` writes into the sources' slots)."""
    keep = torch.arange(src.size(1), device=src.device)[None, :] < lengths[:, None]  # (B, S)
    return model.cross_keys_values(model.encode(src, src_mask=keep))


class EncodeStep(nn.Module):
    """:func:`encode_sources` as a function of tensors, which ``torch.export`` traces: its
    keys and values flat, [k0, v0, k1, v1, ...]."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, lengths: Tensor) -> list[Tensor]:
        return [t for pair in encode_sources(self.model, src, lengths) for t in pair]


# --- loading ---------------------------------------------------------------------------------

def encoder_path(package: Path) -> Path:
    """Where a translator's package's encoder pass lies: decode-float-encoder.pt2."""
    return package.with_name(f"{package.stem}-encoder{package.suffix}")


def few_path(package: Path) -> Path:
    """Where a package's companion for steps of a few rows lies: decode-float-few.pt2."""
    return package.with_name(f"{package.stem}-few{package.suffix}")


class Package:
    """A loaded package, its runner called with the flat list of its input tensors (a
    package's own __call__ parses its input and output specs anew and flattens the
    arguments by pytree at every call: docs/performance.md): the library unpacked beside
    the package, or, where there is none (removed, or a package copied alone), the package
    as AOTInductor loads it, unpacked anew into a temporary folder."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.library, self._constants = intact(path), {}
        if self.library:
            runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(self.library), 1)
            self._constants = own_constants(runner)
            self._boxed_run = runner.run
        else:
            self._boxed_run = torch._inductor.aoti_load_package(str(path)).loader.boxed_run


class CompiledEncoder(Package):
    """A translator's encoder pass, compiled (:class:`EncodeStep`): sources (B, S) of
    ``lengths`` (B,) tokens -> each decoder layer's cross-attention keys and values."""

    def __call__(self, src: Tensor, lengths: Tensor) -> list[tuple[Tensor, Tensor]]:
        flat = self._boxed_run([src, lengths])
        return list(zip(flat[0::2], flat[1::2], strict=True))


class CompiledStep(Package):
    """A loaded package: the engine's decode step over its cache (runner.py), for steps of
    at most ``max_rows`` (:data:`ROWS`) rows; a translator's comes with its encoder pass
    and its companion for steps of a few rows, where they were built."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.max_rows = ROWS
        # a translator's rows in this many runs of equal size (DecodeStep): SOURCE_PARTS, or
        # as its record says (a few-row companion's: one, build.py FEW_PARTS)
        self.parts = SOURCE_PARTS
        # the package's companion for steps of a few rows (build.py), if built, and the most
        # rows it runs at each thread count its build timed it at (:attr:`few_rows`)
        self.few: CompiledStep | None = None
        self.few_limits: dict[int, int] = {1: 0}
        self.encoder: CompiledEncoder | None = None  # a translator's encoder pass, if built
        # a translator's runs of rows each read as many of their own keys as their longest
        # row has; False: every run as many as the step's longest (experiments/companions.py)
        self.own_widths = True
        self._sizes = torch.empty(0)  # W and X are read as lengths: views of one tensor

    @property
    def few_rows(self) -> int:
        """The most rows a step runs on the few-row companion at this process's thread count:
        as timed at the most threads not above it (build.py ``crossovers``: at one thread,
        as a worker of ``--workers 2`` runs on 2 cores, the companion is the faster up to
        fewer rows than at two)."""
        threads = torch.get_num_threads()
        timed = [n for n in self.few_limits if n <= threads]
        return self.few_limits[max(timed) if timed else min(self.few_limits)]

    @few_rows.setter
    def few_rows(self, rows: int) -> None:  # the same at every thread count
        self.few_limits = {1: rows}

    def sizes(self, n: int) -> Tensor:
        if self._sizes.numel() < n:
            self._sizes = torch.empty(max(n, 2 * self._sizes.numel()))
        return self._sizes[:n]

    def rows(self, cache, ids: list[int], positions: list[int], slots: list[int], width: int,
             sources: list[int] | None = None, lengths: list[int] | None = None) -> Tensor:
        """Rows that each feed their one token ``ids[i]`` at ``positions[i]`` (also the
        column it is written to) into their ``slots`` of ``cache`` (a SlotCache) and read
        ``width`` keys of it; a translator's rows read source slots ``sources`` of
        ``lengths`` tokens -> the next-token logits (R, V). The rows come as lists and are
        made whole runs, measured and turned into one tensor in Python (:func:`runs_of`),
        where a step of a few rows would pay more for each tensor operator than for its
        arithmetic."""
        R = len(ids)
        if R <= self.few_rows:
            return self.few.rows(cache, ids, positions, slots, width, sources, lengths)
        lists = [ids, positions, slots] + ([sources, lengths] if cache.seq2seq else [])
        if cache.seq2seq:
            lists, (longest, own) = runs_of(lists, self.parts)
        ids_, at, slots_, *cross = tensor_of(lists, cache.k[0].device).unbind(0)
        args = [ids_[:, None], at[:, None], at[:, None], slots_, self.sizes(width), cache.k,
                cache.v]
        if cache.seq2seq:  # each run of rows reads as many keys as its longest source, and
            # as many of its own as its longest row has (not rounded up, as ``width`` is)
            if not self.own_widths:
                own = [width] * self.parts
            args += [*cross, self.sizes(max(longest)), cache.ck, cache.cv,
                     [self.sizes(n) for n in longest], [self.sizes(n) for n in own]]
        flat = [t for arg in args for t in (arg if isinstance(arg, list) else (arg,))]
        return self._boxed_run(flat)[0][:R]  # (the step's one output, the logits)


def runs_of(lists: list[list[int]], parts: int
            ) -> tuple[list[list[int]], tuple[list[int], list[int]]]:
    """A translator's step's rows as lists of numbers (``lists``: ids, positions, slots,
    sources, source lengths; an entry a row) made ``parts`` runs of equal size (the last
    row again, which writes its keys again: the same bits in the same place), and each
    run's longest source and own keys (its longest row's position + 1)."""
    extra = -len(lists[0]) % parts
    lists = [x + x[-1:] * extra for x in lists]
    positions, lengths = lists[1], lists[4]
    n = len(positions) // parts
    return lists, ([max(lengths[i * n:(i + 1) * n]) for i in range(parts)],
                   [max(positions[i * n:(i + 1) * n]) + 1 for i in range(parts)])


def own_constants(runner) -> dict[str, Tensor]:
    """Move a loaded library's constants (its weights) out of the one block AOTInductor
    copies them into, ``std::malloc``'s, 16-byte aligned: where it lands off a 64-byte line
    (as the heap's history has it), every weight does, and the AVX-512 products that read
    them straddle cache lines (docs/performance.md, "A warm start in under a second"). Each is
    copied into torch's own memory (64-byte aligned) and handed to the runner as its
    constant, kept alive by the returned dict (user-managed), and the block is freed.

    Only where each constant has a name of its own: the runner hands them out by their
    original names, and a library in which two constants share one (Inductor's C++ GEMM
    template for float products writes such pairs) would get one of the two back and the
    other left empty, a crash at the next step; such a library keeps its block as loaded."""
    fqns = runner.get_constant_names_to_original_fqns()
    names = {fqn: name for name, fqn in fqns.items()}
    if len(names) < len(fqns):
        return {}
    kept = {names.get(k, k): t.clone() for k, t in runner.extract_constants_map(False).items()}
    runner.update_constant_buffer(kept, True, False, True)  # the spare buffer, user-managed
    runner.swap_constant_buffer()
    runner.free_inactive_constant_buffer()
    give_back_freed_memory()  # (the heap keeps a freed block's pages resident otherwise)
    return kept


def load_compiled(run_dir: Path, wanted: dict, quantize: str | None,
                  warn: Callable[[str], None], kv_cache: str | None = None
                  ) -> CompiledStep | None:
    """The run's package for ``quantize`` (and ``kv_cache``) if one was built for exactly
    ``wanted`` (:func:`identity`); None if none was built; None with a warning that names
    what differs if one was built for something else."""
    path = package_path(run_dir, quantize, kv_cache)
    if not path.exists():
        return None
    rebuild = f"rebuild it with `vaswani compile {run_dir}{options(quantize, kv_cache)}`"
    _, changed = _record(path, wanted)
    if changed:
        warn(f"{path} does not match what is loaded now: {', '.join(changed)}; running "
             f"eagerly ({rebuild})")
        return None
    step = _opened(path, warn, rebuild, "running eagerly")
    few = few_path(path)
    if step is not None and few.exists():  # (a run compiled before there were none has none)
        built, changed = _record(few, wanted)
        limits = few_limits(built)
        if changed or limits is None:
            warn(f"{few} does not match what is loaded now: "
                 f"{', '.join(changed) or 'its record'}; steps of a few rows run as the "
                 f"others ({rebuild})")
        else:
            step.few = _opened(few, warn, rebuild, "steps of a few rows run as the others")
            if step.few is not None:  # (one built before FEW_PARTS took SOURCE_PARTS runs)
                step.few_limits = limits
                step.few.parts = built.get("parts", SOURCE_PARTS)
    encoder = encoder_path(path)
    if step is not None and encoder.exists():  # a translator's (none in older runs)
        _, changed = _record(encoder, wanted)
        if changed:
            warn(f"{encoder} does not match what is loaded now: {', '.join(changed)}; "
                 f"sources are encoded eagerly ({rebuild})")
        else:
            step.encoder = _opened(encoder, warn, rebuild, "sources are encoded eagerly",
                                   CompiledEncoder)
    return step


def few_limits(record: dict) -> dict[int, int] | None:
    """A few-row companion's most rows by thread count, from its record (build.py): its
    ``by_threads``, or, in a record written before there was one, its ``rows`` at every
    count; None if the record holds neither whole."""
    if "by_threads" not in record:
        rows = record.get("rows")
        return {1: rows} if type(rows) is int else None
    try:
        limits = {int(n): entry["rows"] for n, entry in record["by_threads"].items()}
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
    return limits if limits and all(type(r) is int for r in limits.values()) else None


def _record(package: Path, wanted: dict) -> tuple[dict, list[str]]:
    """A package's record and what differs between it and ``wanted``, in words."""
    try:
        built = json.loads(record_path(package).read_text())
    except (OSError, ValueError):
        built = None
    if not isinstance(built, dict):
        return {}, ["its record"]
    return built, matched(package, built, wanted)


def _opened(path: Path, warn: Callable[[str], None], rebuild: str, otherwise: str,
            kind: type[Package] = CompiledStep) -> Package | None:
    """The package at ``path`` loaded as ``kind``, or None with a warning that says why and
    what is done ``otherwise``."""
    try:
        step = kind(path)
        if step.library is None and unpacked(path).exists():
            warn(f"{unpacked(path)} is not the whole library of {path}; loaded the package "
                 f"from its archive, which takes longer ({rebuild})")
        return step
    except (OSError, ValueError, RuntimeError, zipfile.BadZipFile) as e:
        cause = str(e).strip().splitlines()[0][:200] if str(e).strip() else type(e).__name__
        warn(f"{path} cannot be loaded ({cause}); {otherwise} ({rebuild})")
        return None


def progress(message: str) -> None:
    print(f"vaswani: {message}", file=sys.stderr, flush=True)
