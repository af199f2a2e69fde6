"""The decode step compiled ahead of time: one AOTInductor package per run, built once
(``vaswani compile RUN``), loaded by every later process in seconds.

Why: a decode step of a small model on a CPU is a few hundred small operators, and eager
PyTorch pays a fixed cost for each (dispatch, an allocation, a Python frame): for
SmolLM2-135M about as much as the matrix products themselves. ``torch.export`` traces the
step into one graph; Inductor fuses the small operators into a few C++ loops, freezes the
weights into constants and multiplies with the kernels pinned for the weights' kind
(:data:`GEMM`: ATen's, or its own C++ templates); AOTInductor writes the result as a package (a
shared library and the weights) that ``aoti_load_package`` opens without compiling anything.

What is compiled is the engine's own decode step (step.py ``forward_step``): each of R rows
feeds one token at its position into the slot it names, writes its keys and values into
its column there, and reads the first ``W`` keys of that slot, by index, under a mask of its
position; a translator's rows also read their source slots' ``X`` keys, by index. Rows may
name one slot: the places of a speculative pass (speculate.py), a row's token and the
tokens guessed after it, are rows of their own in the row's slot, each writing its keys
before any reads them, and each computes what the decoding step at its place would, bit
for bit (the same graph, one token a row). Nothing is reimplemented, so the compiled step
computes what the eager one does: the cache's tensors are the package's inputs, written in
place, and the sizes that change from step to step (rows R, keys read W, sources' keys X,
the cache's slots and width) are dynamic dimensions of one package, not one package per
shape. ``W`` and ``X`` come in as the lengths of two empty tensors (a traced graph takes
sizes from its inputs' shapes).

A package is bound to what it was built from, and lies in the run beside a record of that
and its shared library unpacked (package.py); loading one that does not match is refused
with a warning that names the difference; the run is then used eagerly, as it is without a
package (``--eager`` says so outright).

A translator's float package has two companions: one built from the same trace with other
matrix products, for its steps of a few rows (:data:`FEW_GEMM`: the engine calls whichever
its step's rows fall to), and its encoder pass (:class:`EncodeStep`: runner.py encodes the
sources it admits with it). A package loads its companions with it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..atomic import atomic_write, atomic_write_text
from ..cpu.attention import engine_pass
from ..cpu.linear import USE_ONEDNN
from ..devices import give_back_freed_memory
from .config import KV_CACHE
from .package import (
    differences,
    intact,
    options,
    package_path,
    record_path,
    remove_others,
    unpack,
    unpacked,
)
from .plan import StepPlan
from .step import forward_step
from .views import StepCache

# The most rows a package's step takes (its rows' dynamic size); a step of more runs eagerly.
# Every kind of package is the faster up to there at every size tried: float32 up to the 512
# hypotheses a beam-4 translation decodes together by default, int8 and int4 up to the 312
# rows SmolLM2's offline engine decodes at once (docs/performance.md, "A compiled decode
# step").
ROWS = 1 << 14
# The matrix products' kernels, pinned per quantization, not autotuned at build time:
# timings taken on a loaded machine pick badly (pytorch#148494). Float weights: not
# Inductor's C++ GEMM template (slower than the libraries' for many rows) but the library
# eager's products use on this CPU (cpu/linear.py): on Intel's, MKL's sgemm with the
# weights left as they are (PREPACK False: ATen's own product), where oneDNN's prepacked
# form falls behind; elsewhere oneDNN's prepacked linear (PREPACK True), MKL running its
# slower kernels there. int8: the C++ template, which keeps the products in float32 where
# ATen's kernel rounds them to bfloat16. int4: ATen's own kernel, which Inductor's int4
# template (AVX-512 only) cannot replace everywhere. The figures: docs/performance.md,
# "A compiled decode step".
GEMM = {None: "ATEN", "int8": "CPP", "int4": "ATEN", "int4-g64": "ATEN"}
# The C++ template's int8 kernel on an AVX-512 CPU: Inductor's micro-kernel multiplies a
# block of rows by 48 columns of the weight, keeping one float32 vector of sums per row and
# 16 columns. Its blocks of 8 rows need 24 such vectors, which the C++ compiler (GCC 12)
# keeps on the stack, storing each after every multiply-add: from 6 rows on, a step cost
# about twice what it does in blocks of 4 rows (12 vectors, kept in registers), which make
# the same sums in the same order (docs/performance.md, "The int8 kernel's blocks of rows").
# Only the blocking of that kernel is pinned; AMX's and AVX2's are as Inductor chooses.
INT8_ROWS_BLOCK = (4, 48, 1)
PREPACK = {"int8": True, "int4": True, "int4-g64": True}  # float's: USE_ONEDNN
# A translator's rows read their sources' keys in this many runs of rows, each run only as
# many keys as its longest source (plan.py ``parts``), not every row the step's longest.
SOURCE_PARTS = 4


# A step of a few rows costs a float package mostly the fixed cost of each product's call
# into the library (oneDNN's: about 35 us a call on the Zen 4 EPYC, 13 products a step in
# the demo translator), not arithmetic; Inductor's C++ GEMM template, compiled into the step,
# has next to none, but multiplies many rows at a half to two thirds of the library's speed.
# So a translator's float package has a companion built with the template (FEW_GEMM) for the
# steps of at most as many rows as it measured faster at, timed against the package when
# both are built (:func:`crossover`, over FEW_ROWS_TRIED; docs/performance.md, "Steps of a
# few rows"): the last sentences of a batch, and a sentence translated alone.
FEW_GEMM = "CPP"
FEW_ROWS_TRIED = (4, 8, 12, 16, 24, 32)  # rows, multiples of SOURCE_PARTS


def inductor_options(quantize: str | None, gemm: str | None = None) -> dict:
    """Inductor's settings for a package of ``quantize``'s weights; ``gemm``: the products'
    kernels if not :data:`GEMM`'s (a few-row package's, FEW_GEMM)."""
    return {"freezing": True,  # the weights as constants, laid out once for the products
            "max_autotune": True,  # Inductor's own GEMM kernels for the step's shapes ...
            "max_autotune_gemm_backends": gemm or GEMM[quantize],  # ... or ATen's, as pinned
            "cpp.weight_prepack": PREPACK.get(quantize, USE_ONEDNN),
            # a value computed by more than 8 operations is written out, not recomputed
            # where it is read (Inductor's default on a CPU, 50, let a rotated query be
            # recomputed, its cos and sin with it, for every key the attention's sums
            # read, several times slower; docs/performance.md, "A compiled decode step")
            "realize_opcount_threshold": 8}


@contextmanager
def int8_blocking(block: tuple[int, int, int] = INT8_ROWS_BLOCK) -> Iterator[None]:
    """While inside, Inductor's AVX-512 micro-kernel for bfloat16 inputs times int8 weights
    (summed in float32) blocks ``block`` (rows, columns, inputs) instead of choosing among
    its own (:data:`INT8_ROWS_BLOCK` says why)."""
    import torch._inductor.compile_fx  # noqa: F401  (first: the order Inductor imports in)
    from torch._inductor.codegen import cpp_micro_gemm as micro
    from torch._inductor.cpu_vec_isa import VecAVX512

    def int8_avx512(config) -> bool:
        return (config.vec_isa_cls is VecAVX512 and config.input_dtype == torch.bfloat16
                and config.input2_dtype == torch.int8 and config.register_blocking.block_k == 1)

    saved = {cls: list(configs) for cls, configs in micro.micro_gemm_configs.items()}
    try:
        for configs in micro.micro_gemm_configs.values():
            ours = [c for c in configs if int8_avx512(c)]
            if ours:  # one: theirs would rank above it as the larger blocks
                configs[:] = [c for c in configs if not int8_avx512(c)] + [
                    dataclasses.replace(ours[0], register_blocking=micro.GemmBlocking(*block))]
        yield
    finally:
        for cls, configs in saved.items():
            micro.micro_gemm_configs[cls][:] = configs


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
    values; part_keys: ``SOURCE_PARTS`` empty tensors, the source keys each run of R /
    SOURCE_PARTS rows reads (R a multiple of it) -> logits (R, V)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: Tensor, positions: Tensor, columns: Tensor, slots: Tensor,
                keys: Tensor, k: list[Tensor], v: list[Tensor], sources: Tensor | None = None,
                lengths: Tensor | None = None, cross: Tensor | None = None,
                ck: list[Tensor] | None = None, cv: list[Tensor] | None = None,
                part_keys: list[Tensor] | None = None) -> Tensor:
        cache = CacheTensors(k, v, ck or [], cv or [], next(self.model.parameters()).dtype)
        extra = {}
        if cache.seq2seq:
            size = ids.size(0) // len(part_keys)
            extra = dict(sources=sources, lengths=lengths, cross=cross.size(0),
                         parts=[(i * size, (i + 1) * size, run.size(0))
                                for i, run in enumerate(part_keys)])
        plan = StepPlan(columns, keys.size(0), slots=slots, **extra)
        last = torch.zeros(ids.size(0), dtype=torch.long, device=ids.device)
        return forward_step(self.model, cache, ids, positions, last, plan)


class EncodeStep(nn.Module):
    """A translator's encoder pass as a function of tensors, which ``torch.export`` traces:
    sources src (B, S), padded, of ``lengths`` (B,) tokens -> each decoder layer's
    cross-attention keys and values, flat: [k0, v0, k1, v1, ...], (B, Hkv, S, Dh) each
    (what runner.py ``Runner.encode`` writes into the sources' slots)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, src: Tensor, lengths: Tensor) -> list[Tensor]:
        keep = torch.arange(src.size(1), device=src.device)[None, :] < lengths[:, None]
        memory = self.model.encode(src, src_mask=keep)
        return [t for pair in self.model.cross_keys_values(memory) for t in pair]


def encoder_inputs(model: nn.Module) -> tuple[tuple, tuple]:
    """Sources to trace :class:`EncodeStep` with (one shorter than the rest), and their
    dynamic dimensions: the sources and their length, up to the model's ``max_len``."""
    d = next(model.parameters()).device
    B, S = 7, 23
    src = torch.full((B, S), 5, dtype=torch.long, device=d)
    lengths = torch.full((B,), S, dtype=torch.long, device=d)
    lengths[0] = 5
    batch = torch.export.Dim("sources", min=1, max=ROWS)
    length = torch.export.Dim("source_length", min=2, max=model.config.max_len)
    return (src, lengths), ({0: batch, 1: length}, {0: batch})


# --- building and loading -------------------------------------------------------------------

def example_inputs(model: nn.Module, seq2seq: bool, kv_cache: str | None = None
                   ) -> tuple[tuple, tuple]:
    """Inputs to trace the step with, and their dynamic dimensions. Sizes are picked unlike
    each other (and above 1, which export would fix as a constant) so that no two dynamic
    sizes are taken for one. The cache in the model's dtype, or ``kv_cache``'s."""
    c, param = model.config, next(model.parameters())
    d, dtype = param.device, KV_CACHE[kv_cache] if kv_cache else param.dtype
    R, slots, width, W, S, X = (12, 13, 48, 19, 40, 17) if seq2seq else (3, 5, 48, 19, 40, 11)
    n = c.n_decoder_layers

    def cache(w: int) -> list[Tensor]:
        return [torch.zeros(slots, c.n_kv_heads, w, c.head_dim, dtype=dtype, device=d)
                for _ in range(n)]

    index = dict(dtype=torch.long, device=d)
    rows = torch.export.Dim("rows", min=1, max=ROWS)
    if seq2seq:  # in SOURCE_PARTS runs of equal size
        rows = SOURCE_PARTS * torch.export.Dim("run", min=1, max=ROWS // SOURCE_PARTS)
    # every layer's cache has the engine's one slot count and width (cache.py): one size
    # each for the trace, not two of their own for each layer's keys and values (export's
    # Dim.AUTO), which Inductor reasons about apart, building the slower
    slots_, width_ = torch.export.Dim("slots", min=1), torch.export.Dim("width", min=1)
    layer = [{0: slots_, 2: width_}] * n
    args = (torch.ones(R, 1, **index), torch.arange(R, **index)[:, None],
            torch.arange(R, **index)[:, None], torch.arange(R, **index).flip(0),
            torch.empty(W, device=d), cache(width), cache(width))
    shapes = ({0: rows}, {0: rows}, {0: rows}, {0: rows}, {0: torch.export.Dim("keys", min=1)},
              layer, layer)
    if seq2seq:
        args += (torch.zeros(R, **index), torch.full((R,), X, **index),
                 torch.empty(X, device=d), cache(S), cache(S),
                 [torch.empty(n, device=d) for n in (16, 14, 10, 7)[:SOURCE_PARTS]])
        source = [{0: slots_, 2: torch.export.Dim("source_width", min=1)}] * n
        shapes += ({0: rows}, {0: rows}, {0: torch.export.Dim("cross", min=1)}, source, source,
                   [{0: torch.export.Dim(f"part{i}", min=1)} for i in range(SOURCE_PARTS)])
    return args, shapes


def has_few_rows(quantize: str | None, seq2seq: bool) -> bool:
    """Whether a package gets a companion for steps of a few rows (:data:`FEW_GEMM`): a
    translator's float package, the one measured. A language model's steps read its
    weights from memory, which the template does not change; int8's package multiplies
    with the template already."""
    return quantize is None and seq2seq


def encoder_path(package: Path) -> Path:
    """Where a translator's package's encoder pass lies: decode-float-encoder.pt2."""
    return package.with_name(f"{package.stem}-encoder{package.suffix}")


def few_path(package: Path) -> Path:
    """Where a package's companion for steps of a few rows lies: decode-float-few.pt2."""
    return package.with_name(f"{package.stem}-few{package.suffix}")


def build(model: nn.Module, seq2seq: bool, out: Path, record: dict,
          say: Callable[[str], None] = print, quantize: str | None = None,
          kv_cache: str | None = None) -> float:
    """Export ``model``'s decode step, compile it with AOTInductor and write the package to
    ``out`` (and ``record`` beside it), each written whole (a kill leaves the previous one);
    where :func:`has_few_rows`, its companion for steps of a few rows too, kept for the rows
    it measured faster at (:func:`crossover`, in its record) or removed if none. ``say``
    reports each stage; ``quantize``: the model's (its products' kernels, GEMM);
    ``kv_cache``: the cache's dtype by name (config.py ``KV_CACHE``; None: the model's).
    Returns the seconds it took."""
    start = time.perf_counter()
    args, shapes = example_inputs(model, seq2seq, kv_cache)
    with torch.no_grad():  # Inductor freezes the weights only without autograd
        say("tracing the decode step (torch.export) ...")
        program = torch.export.export(DecodeStep(model).eval(), args, dynamic_shapes=shapes)
        say(f"compiling it (AOTInductor; a few minutes on 2 cores; "
            f"{time.perf_counter() - start:.0f} s so far) ...")
        write_package(program, out, inductor_options(quantize), say)
        encoder = encoder_path(out)
        if seq2seq:  # the encoder pass, eager until now (every translator's is float)
            say(f"compiling the encoder pass ({time.perf_counter() - start:.0f} s so far) ...")
            args, shapes = encoder_inputs(model)
            with engine_pass("prefill"):  # the attention the eager pass takes
                traced = torch.export.export(EncodeStep(model).eval(), args,
                                             dynamic_shapes=shapes)
            write_package(traced, encoder, inductor_options(quantize), say)
        few, rows = few_path(out), 0
        if has_few_rows(quantize, seq2seq):
            say(f"compiling it for steps of a few rows (Inductor's C++ GEMM template; "
                f"{time.perf_counter() - start:.0f} s so far) ...")
            write_package(program, few, inductor_options(quantize, FEW_GEMM), say)
            rows, timings = crossover(CompiledStep(out), CompiledStep(few), model, kv_cache)
            say(f"timed both: the few-row step is the faster up to {rows} rows"
                if rows else "timed both: the few-row step is the faster at no size here, "
                "not kept")
    seconds = time.perf_counter() - start
    if rows:
        atomic_write_text(record_path(few), json.dumps(
            {**record, "gemm": FEW_GEMM, "rows": rows, "step_ms": timings}, indent=1) + "\n")
    else:  # none, or one built before that is not this package's
        remove_package(few)
    if seq2seq:
        atomic_write_text(record_path(encoder), json.dumps(record, indent=1) + "\n")
    atomic_write_text(record_path(out), json.dumps({**record, "build_seconds": round(seconds, 1)},
                                                   indent=1) + "\n")
    return seconds


def write_package(program, out: Path, configs: dict, say: Callable[[str], None]) -> None:
    """Compile an exported step with Inductor's ``configs`` into the package ``out``, its
    library unpacked beside it, each written whole."""
    with tempfile.TemporaryDirectory() as tmp:
        with int8_blocking():
            built = torch._inductor.aoti_compile_and_package(
                program, package_path=str(Path(tmp) / "step.pt2"), inductor_configs=configs)
        out.parent.mkdir(parents=True, exist_ok=True)
        say(f"writing {out.name} and its library, unpacked for every later load to open ...")
        library = unpacked(out, Path(built))
        new = not library.exists()
        unpack(Path(built), out)
        try:
            atomic_write(out, lambda path: shutil.copyfile(built, path))
        except BaseException:
            if new:  # (an identical package's library stays, with its package)
                library.unlink(missing_ok=True)
            raise
        remove_others(library, out)


def remove_package(package: Path) -> None:
    """Remove a package, its record and its unpacked libraries (the record first: a package
    without one is not loaded)."""
    record_path(package).unlink(missing_ok=True)
    for library in package.parent.glob(f"{package.stem}.*.so"):
        library.unlink(missing_ok=True)
    package.unlink(missing_ok=True)


def crossover(step: CompiledStep, few: CompiledStep, model: nn.Module,
              kv_cache: str | None = None, tried: tuple[int, ...] = FEW_ROWS_TRIED,
              rounds: int = 9) -> tuple[int, dict[str, list[float]]]:
    """Up to how many rows the few-row package ``few`` is faster than ``step`` (0: at none
    of ``tried``, smallest first, where it is not, it is not at any larger size either):
    each timed ``rounds`` times at each size, the two in turn (a busy machine slows both
    alike), the best of each compared. Returns the rows and the times (ms: package, few)."""
    rows, timings = 0, {}
    for n in tried:
        cache, args = probe_inputs(model, n, kv_cache)
        best = [float("inf"), float("inf")]
        with torch.inference_mode():
            for _ in range(rounds):
                for i, s in enumerate((step, few)):
                    t = time.perf_counter()
                    s(cache, *args)
                    best[i] = min(best[i], time.perf_counter() - t)
        timings[str(n)] = [round(b * 1e3, 3) for b in best]
        if best[1] >= best[0]:
            break
        rows = n
    return rows, timings


def probe_inputs(model: nn.Module, rows: int, kv_cache: str | None = None
                 ) -> tuple[CacheTensors, tuple]:
    """A translator's step of ``rows`` rows as :class:`CompiledStep` takes it, to time:
    each row 30 tokens into its own slot (32 keys read) and a source of 40 tokens."""
    c, param = model.config, next(model.parameters())
    d, dtype = param.device, KV_CACHE[kv_cache] if kv_cache else param.dtype

    def cache(width: int) -> list[Tensor]:
        return [torch.randn(rows, c.n_kv_heads, width, c.head_dim, device=d).to(dtype)
                for _ in range(c.n_decoder_layers)]
    tensors = CacheTensors(cache(64), cache(64), cache(48), cache(48), param.dtype)
    index = dict(dtype=torch.long, device=d)
    at = torch.full((rows, 1), 30, **index)
    return tensors, (torch.ones(rows, 1, **index), at, at, torch.arange(rows, **index), 32,
                     torch.arange(rows, **index), torch.full((rows,), 40, **index))


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
        # the package's companion for steps of at most few_rows rows (FEW_GEMM), if built
        self.few: CompiledStep | None = None
        self.few_rows = 0
        self.encoder: CompiledEncoder | None = None  # a translator's encoder pass, if built
        self._sizes = torch.empty(0)  # W and X are read as lengths: views of one tensor

    def sizes(self, n: int) -> Tensor:
        if self._sizes.numel() < n:
            self._sizes = torch.empty(max(n, 2 * self._sizes.numel()))
        return self._sizes[:n]

    def __call__(self, cache, ids: Tensor, positions: Tensor, columns: Tensor, slots: Tensor,
                 width: int, sources: Tensor | None = None, lengths: Tensor | None = None
                 ) -> Tensor:
        """Rows that each feed ``ids`` (R, 1) at ``positions`` into ``columns`` of their
        ``slots`` (R,) of ``cache`` (a SlotCache) and read ``width`` keys of it; a
        translator's rows read source slots ``sources`` of ``lengths`` tokens -> the
        next-token logits (R, V)."""
        R = ids.size(0)
        if R <= self.few_rows:
            return self.few(cache, ids, positions, columns, slots, width, sources, lengths)
        if cache.seq2seq and R % SOURCE_PARTS:  # its last row again, which writes its keys
            extra = SOURCE_PARTS - R % SOURCE_PARTS  # again: the same bits in the same place
            ids, positions, columns, slots, sources, lengths = (
                torch.cat([x, x[-1:].expand(extra, *x.shape[1:])])
                for x in (ids, positions, columns, slots, sources, lengths))
        args = [ids, positions, columns, slots, self.sizes(width), cache.k, cache.v]
        if cache.seq2seq:  # each run of rows reads as many keys as its longest source
            longest = lengths.view(SOURCE_PARTS, -1).amax(1).tolist()
            args += [sources, lengths, self.sizes(max(longest)), cache.ck, cache.cv,
                     [self.sizes(n) for n in longest]]
        flat = [t for arg in args for t in (arg if isinstance(arg, list) else (arg,))]
        return self._boxed_run(flat)[0][:R]  # (the step's one output, the logits)


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
        rows = built.get("rows")
        if changed or not isinstance(rows, int):
            warn(f"{few} does not match what is loaded now: "
                 f"{', '.join(changed) or 'its record'}; steps of a few rows run as the "
                 f"others ({rebuild})")
        else:
            step.few = _opened(few, warn, rebuild, "steps of a few rows run as the others")
            step.few_rows = rows if step.few is not None else 0
    encoder = encoder_path(path)
    if step is not None and encoder.exists():  # a translator's (none before 2026-12-04)
        _, changed = _record(encoder, wanted)
        if changed:
            warn(f"{encoder} does not match what is loaded now: {', '.join(changed)}; "
                 f"sources are encoded eagerly ({rebuild})")
        else:
            step.encoder = _opened(encoder, warn, rebuild, "sources are encoded eagerly",
                                   CompiledEncoder)
    return step


def _record(package: Path, wanted: dict) -> tuple[dict, list[str]]:
    """A package's record and what differs between it and ``wanted``, in words."""
    try:
        built = json.loads(record_path(package).read_text())
    except (OSError, ValueError):
        built = None
    if not isinstance(built, dict):
        return {}, ["its record"]
    return built, differences(built, wanted)


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
