"""Building a compiled decode step (compiled.py says what and why): the kernels pinned for
each kind of weights, the inputs the step is traced with, and the packages written into a
run (``vaswani compile RUN``, inference/compiled.py ``compile_run``): the step, and for a
translator its encoder pass and its step for a few rows, kept for the rows it was measured
faster at (:func:`crossover`)."""

from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import Tensor, nn

from ..atomic import atomic_write, atomic_write_text
from ..cpu.attention import engine_pass
from ..cpu.linear import USE_ONEDNN
from .compiled import (
    ROWS,
    SOURCE_PARTS,
    CacheTensors,
    CompiledStep,
    DecodeStep,
    EncodeStep,
    encoder_path,
    few_path,
)
from .config import KV_CACHE
from .package import record_path, remove_others, unpack, unpacked

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
# A step of a few rows costs a float package mostly the fixed cost of each product's call
# into the library, not arithmetic; Inductor's C++ GEMM template, compiled into the step,
# has next to none, but multiplies many rows more slowly than the library. So a
# translator's float package has a companion built with the template (FEW_GEMM) for the
# steps of at most as many rows as it measured faster at, timed against the package when
# both are built (:func:`crossover`, over FEW_ROWS_TRIED; docs/performance.md, "Steps of a
# few rows"): the last sentences of a batch, and a sentence translated alone.
FEW_GEMM = "CPP"
FEW_ROWS_TRIED = (4, 8, 12, 16, 24, 32)  # rows, multiples of SOURCE_PARTS
# The few-row companion takes a translator's rows as one run (DecodeStep), not in
# SOURCE_PARTS runs of equal size: a step of one row is one row, not four (the last row
# again three times, each multiplied by every weight), and at a few rows, runs read few
# keys fewer (docs/performance.md, "Steps of a few rows").
FEW_PARTS = 1


def inductor_options(quantize: str | None, gemm: str | None = None) -> dict:
    """Inductor's settings for a package of ``quantize``'s weights; ``gemm``: the products'
    kernels if not :data:`GEMM`'s (a few-row package's, FEW_GEMM)."""
    backend = gemm or GEMM[quantize]
    return {"freezing": True,  # the weights as constants, laid out once for the products
            "max_autotune": True,  # Inductor's own GEMM kernels for the step's shapes ...
            "max_autotune_gemm_backends": backend,  # ... or ATen's, as pinned
            # Inductor's C++ template takes only prepacked weights (without, it offers no
            # kernel, and a build of that backend alone fails): always for it, and for
            # float products as eager multiplies them on this CPU (cpu/linear.py)
            "cpp.weight_prepack": backend == "CPP" or PREPACK.get(quantize, USE_ONEDNN),
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


def example_inputs(model: nn.Module, seq2seq: bool, kv_cache: str | None = None,
                   parts: int = SOURCE_PARTS) -> tuple[tuple, tuple]:
    """Inputs to trace the step with, and their dynamic dimensions. Sizes are picked unlike
    each other (and above 1, which export would fix as a constant) so that no two dynamic
    sizes are taken for one. The cache in the model's dtype, or ``kv_cache``'s; a
    translator's rows in ``parts`` runs of equal size."""
    c, param = model.config, next(model.parameters())
    d, dtype = param.device, KV_CACHE[kv_cache] if kv_cache else param.dtype
    R, slots, width, W, S, X = (12, 13, 48, 19, 40, 17) if seq2seq else (3, 5, 48, 19, 40, 11)
    n = c.n_decoder_layers

    def cache(w: int) -> list[Tensor]:
        return [torch.zeros(slots, c.n_kv_heads, w, c.head_dim, dtype=dtype, device=d)
                for _ in range(n)]

    index = dict(dtype=torch.long, device=d)
    rows = torch.export.Dim("rows", min=1, max=ROWS)
    if seq2seq and parts > 1:  # in runs of equal size
        rows = parts * torch.export.Dim("run", min=1, max=ROWS // parts)
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
                 [torch.empty(n, device=d) for n in (16, 14, 10, 7)[:parts]],
                 [torch.empty(n, device=d) for n in (18, 15, 11, 9)[:parts]])
        source = [{0: slots_, 2: torch.export.Dim("source_width", min=1)}] * n
        shapes += ({0: rows}, {0: rows}, {0: torch.export.Dim("cross", min=1)}, source, source,
                   [{0: torch.export.Dim(f"part{i}", min=1)} for i in range(parts)],
                   [{0: torch.export.Dim(f"own{i}", min=1)} for i in range(parts)])
    return args, shapes


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


def has_few_rows(quantize: str | None, seq2seq: bool) -> bool:
    """Whether a package gets a companion for steps of a few rows (:data:`FEW_GEMM`): a
    translator's float package, the one measured. A language model's steps read its
    weights from memory, which the template does not change; int8's package multiplies
    with the template already."""
    return quantize is None and seq2seq


def written(out: Path, quantize: str | None, seq2seq: bool) -> list[Path]:
    """Every file :func:`build` may write for the package ``out`` but its libraries: the
    package and its record, and a translator's companions and theirs."""
    packages = [out]
    if seq2seq:
        packages.append(encoder_path(out))
    if has_few_rows(quantize, seq2seq):
        packages.append(few_path(out))
    return [f for p in packages for f in (p, record_path(p))]


def build(model: nn.Module, seq2seq: bool, out: Path, record: dict,
          say: Callable[[str], None] = print, quantize: str | None = None,
          kv_cache: str | None = None) -> float:
    """Export ``model``'s decode step, compile it with AOTInductor and write the package to
    ``out`` (and ``record`` beside it), each written whole (a kill leaves the previous one);
    a translator's encoder pass too (:class:`EncodeStep`) and, where :func:`has_few_rows`,
    its companion for steps of a few rows, kept for the rows it measured faster at
    (:func:`crossover`, in its record) or removed if none. ``say``
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
        few, found, limits = few_path(out), {}, {}
        if has_few_rows(quantize, seq2seq):
            say(f"compiling it for steps of a few rows (Inductor's C++ GEMM template; "
                f"{time.perf_counter() - start:.0f} s so far) ...")
            args, shapes = example_inputs(model, seq2seq, kv_cache, FEW_PARTS)  # one run
            program = torch.export.export(DecodeStep(model).eval(), args, dynamic_shapes=shapes)
            write_package(program, few, inductor_options(quantize, FEW_GEMM), say)
            companion = CompiledStep(few)
            companion.parts = FEW_PARTS
            found = crossovers(CompiledStep(out), companion, model, kv_cache)
            limits = {n: rows for n, (rows, _) in found.items()}
            say(f"timed both: the few-row step is the faster {few_rows_text(limits)}"
                if any(limits.values()) else
                "timed both: the few-row step is the faster at no size here, not kept")
    seconds = time.perf_counter() - start
    if any(limits.values()):  # its rows and times by thread count
        by_threads = {str(n): {"rows": rows, "step_ms": ms} for n, (rows, ms) in found.items()}
        atomic_write_text(record_path(few), json.dumps(
            {**record, "gemm": FEW_GEMM, "parts": FEW_PARTS, "by_threads": by_threads},
            indent=1) + "\n")
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


def crossovers(step: CompiledStep, few: CompiledStep, model: nn.Module,
               kv_cache: str | None = None) -> dict[int, tuple[int, dict]]:
    """:func:`crossover` at one thread and at this process's thread count, each (the count
    restored after): a worker of ``--workers N`` decodes on 1/N of the threads, at which
    the companion is the faster up to fewer rows (docs/performance.md, "Steps of a few
    rows"); the package runs each count by the most threads timed not above it
    (compiled.py ``CompiledStep.few_rows``)."""
    threads, found = torch.get_num_threads(), {}
    try:
        for n in sorted({1, threads}):
            torch.set_num_threads(n)
            found[n] = crossover(step, few, model, kv_cache)
    finally:
        torch.set_num_threads(threads)
    return found


def few_rows_text(rows: dict[int, int]) -> str:
    """Up to how many rows the companion runs (``rows`` by thread count), in words: "up
    to 16 rows, 8 at 1 thread"."""
    most = rows[max(rows)]
    text = f"up to {most} rows" if most else "at no size"
    if len(set(rows.values())) > 1:
        text += "".join(f", {r} at {n} thread{'s' if n > 1 else ''}"
                        for n, r in sorted(rows.items()) if n != max(rows))
    return text


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
                    s.rows(cache, *args)
                    best[i] = min(best[i], time.perf_counter() - t)
        timings[str(n)] = [round(b * 1e3, 3) for b in best]
        if best[1] >= best[0]:
            break
        rows = n
    return rows, timings


def probe_inputs(model: nn.Module, rows: int, kv_cache: str | None = None
                 ) -> tuple[CacheTensors, tuple]:
    """A translator's step of ``rows`` rows as :meth:`CompiledStep.rows` takes it, to time:
    each row 30 tokens into its own slot (32 keys read) and a source of 40 tokens."""
    c, param = model.config, next(model.parameters())
    d, dtype = param.device, KV_CACHE[kv_cache] if kv_cache else param.dtype

    def cache(width: int) -> list[Tensor]:
        return [torch.randn(rows, c.n_kv_heads, width, c.head_dim, device=d).to(dtype)
                for _ in range(c.n_decoder_layers)]
    tensors = CacheTensors(cache(64), cache(64), cache(48), cache(48), param.dtype)
    return tensors, ([1] * rows, [30] * rows, list(range(rows)), 32, list(range(rows)),
                     [40] * rows)

