"""Which device to run on: ``"auto"`` picks CUDA when PyTorch sees a GPU, else the CPU, and a
device that is not there is a clear error (not PyTorch's assertion)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import platform
import re
import sys

import torch


def resolve_device(name: str, local_rank: int = 0, *, on_cpu: str = "--device cpu"
                   ) -> torch.device:
    """``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"`` or ``"mps"`` -> a usable torch.device.
    ``"auto"`` and ``"cuda"`` give each process of a node the GPU of its ``local_rank``;
    ``on_cpu``: how the caller's user asks for the CPU instead (a command's flag)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and torch.cuda.is_available():
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"device ({name!r}): the process of local rank {local_rank} has no GPU of its "
                f"own (this machine has {torch.cuda.device_count()}): start at most that many "
                "processes per node (torchrun --nproc_per_node), or train on the CPU "
                "(--set train.device=cpu)")
        name = f"cuda:{local_rank}"
    if not re.fullmatch(r"cpu|mps|cuda(:\d+)?", str(name)):  # what vaswani runs on
        raise ValueError(f"device ({name!r}) must be 'auto', 'cpu', 'cuda', 'cuda:N' or "
                         "'mps'")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device ({name!r}) asked for CUDA, but this PyTorch sees no CUDA "
                             f"device (a CPU-only build, or no GPU); use {on_cpu}")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device ({name!r}): there are only {torch.cuda.device_count()} "
                             "CUDA devices")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"device ({name!r}): MPS is not available on this machine")
    return device


AUTOCAST = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def usable_precision(asked: str, device: torch.device, *, say: bool = True) -> str:
    """The precision to train in: as ``asked``, unless the device lacks it natively: bf16 on
    a CPU without AVX512-BF16/AMX (emulated, tens of times slower than float32), fp16 anywhere
    but CUDA (CPUs emulate it too). Then float32, said once on stderr (``say``)."""
    fine = {"fp32": True, "bf16": asked != "bf16" or bf16_is_fast(device),
            "fp16": device.type == "cuda"}[asked]
    if fine:
        return asked
    if say:
        why = ("has no native bfloat16 (AVX512-BF16 or AMX on a CPU)" if asked == "bf16" else
               "is not a CUDA GPU (fp16 autocast with a gradient scaler is for GPUs)")
        print(f"vaswani train: [train] precision = {asked!r}, but this {device.type.upper()} "
              f"{why}, where it would run far slower than float32: training in float32 "
              "(--set train.precision=fp32 says so quietly)", file=sys.stderr, flush=True)
    return "fp32"


CPUINFO = "/proc/cpuinfo"  # Linux's description of the CPUs


def _cpuinfo(field: str) -> str | None:
    """The value of ``field`` for the first CPU in ``CPUINFO``; None where there is no such
    file or field."""
    try:
        with open(CPUINFO) as f:
            for line in f:
                if line.startswith(field):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_name() -> str:
    """The CPU's model name (``CPUINFO``), else what ``platform`` knows: for
    reports of where a result was measured."""
    return _cpuinfo("model name") or platform.processor() or platform.machine()


def cpu_generation() -> str | None:
    """The CPU's family and model numbers (``CPUINFO``), e.g. "family 25, model 17": a
    virtual machine's model name may say only "AMD EPYC", and two with the same name and
    instruction sets can differ in float32 speed (Zen 4, family 25, runs AVX-512 on 256-bit
    units; Zen 5, family 26, on 512-bit ones). None where it is not known."""
    family, model = _cpuinfo("cpu family"), _cpuinfo("model\t")
    return None if family is None else f"family {family}, model {model}"


SIMD_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16")


def cpu_flags() -> set[str]:
    """The CPU's instruction sets, Linux's names (``CPUINFO``'s flags); empty where that
    is not known."""
    return set((_cpuinfo("flags") or "").split())


def cpu_simd() -> list[str]:
    """Which of ``SIMD_FLAGS`` the CPU has (``CPUINFO``): the vector instruction sets that
    decide PyTorch's, oneDNN's and CTranslate2's kernels."""
    flags = cpu_flags()
    return [f for f in SIMD_FLAGS if f in flags]


def cpu_is_intel() -> bool:
    """Whether the CPU is Intel's (its vendor in ``CPUINFO``): Intel MKL, which PyTorch
    calls for float32 matrix products, runs its AVX-512 kernels on Intel CPUs only, and its
    AVX2 ones on others (cpu/linear.py chooses oneDNN there)."""
    return _cpuinfo("vendor_id") == "GenuineIntel"


def bf16_is_fast(device: torch.device) -> bool:
    """Whether bfloat16 matmuls run natively here: CUDA with bf16 support, or a CPU with
    AVX512-BF16 or AMX. Elsewhere PyTorch emulates them, far slower than float32, so bf16
    autocast would slow training down instead of speeding it up."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu":
        return False
    flags = _cpuinfo("flags")
    if flags is not None:
        return bool(set(flags.split()) & {"avx512_bf16", "amx_bf16"})
    return _measured_bf16_is_fast()


def _measured_bf16_is_fast() -> bool:
    """Where the CPU's flags cannot be read: time a bf16 and a float32 matmul. Emulated bf16
    is tens of times slower than float32; native bf16 without AMX up to about twice as slow;
    so the line is drawn at eight times."""
    import time

    a32 = torch.randn(512, 512)
    times = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = a32.to(dtype)
        for _ in range(2):  # warm-up: threads and kernels
            a @ a
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            a @ a
            best = min(best, time.perf_counter() - start)
        times[dtype] = best
    return times[torch.bfloat16] < 8 * times[torch.float32]


def peak_resident_bytes() -> int:
    """This process's peak resident memory so far, in bytes: Linux's ``VmHWM`` (the high-water
    mark of the process's own memory). Not ``ru_maxrss``, which a process started by another
    carries over from its parent (Linux keeps it across ``fork`` and ``exec``): a child of a
    400 MB Python reports at least 400 MB, whatever it holds itself. ``ru_maxrss`` where
    there is no /proc."""
    try:
        status = open("/proc/self/status").read()
    except OSError:
        import resource

        scale = 1 if sys.platform == "darwin" else 1024  # bytes on macOS, KiB on Linux
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale
    return int(re.search(r"^VmHWM:\s+(\d+) kB", status, re.M)[1]) * 1024


@functools.cache  # finding the library runs ldconfig: once per process
def c_function(name: str):
    """The C library's function ``name`` on Linux (``madvise``, glibc's allocator settings,
    ``malloc_trim``); None elsewhere or where the library lacks it (musl has no
    ``malloc_trim``)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def give_back_freed_memory() -> bool:
    """Hand the pages of the C heap's freed blocks back to the kernel (glibc's
    ``malloc_trim(0)``): those between blocks still in use too, which the heap's own trimming
    (only its free top) keeps resident. For a pass that frees as much as it keeps, such as
    quantizing weights as they are read, where which freed block the next allocation reuses
    varies from run to run (docs/performance.md, "A compiled decode step"). Takes
    milliseconds; returns whether it ran."""
    trim = c_function("malloc_trim")
    if trim is None:
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True
