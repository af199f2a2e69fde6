"""Devices: resolving names to usable devices, and whether bf16 is native here."""

import sys

import pytest
import torch

import vaswani.devices
from vaswani.devices import (
    _measured_bf16_is_fast,
    bf16_is_fast,
    cpu_generation,
    cpu_is_intel,
    cpu_name,
    cpu_simd,
    resolve_device,
)


def test_resolve_device_names_and_errors():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match=r"device \('foo'\) must be"):
        resolve_device("foo")
    for other in ("meta", "xpu", "cpu:0:1", "cuda:-1"):  # torch devices vaswani does not run on
        with pytest.raises(ValueError, match=rf"device \('{other}'\) must be 'auto', 'cpu'"):
            resolve_device(other)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA device"):
            resolve_device("cuda:0")


def test_each_process_of_a_node_gets_the_gpu_of_its_local_rank(monkeypatch):
    """Two processes asking for "cuda" (or "auto") on a one-GPU machine would both take GPU 0,
    which NCCL refuses with an error that names nothing of this; each takes the GPU of its
    local rank, and a rank past the last GPU is told what to do."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    for name in ("cuda", "auto"):
        assert [resolve_device(name, r) for r in (0, 1)] == [torch.device("cuda:0"),
                                                            torch.device("cuda:1")]
        with pytest.raises(ValueError, match=r"local rank 2 has no GPU of its own \(this "
                                             r"machine has 2\).*--nproc_per_node.*cpu"):
            resolve_device(name, 2)
    assert resolve_device("cuda:1", 0) == torch.device("cuda:1")  # named: as named


def test_the_cpu_flags_and_a_timing_agree_on_bf16():
    """On this machine the flag check (avx512_bf16 / amx_bf16) and the timing fallback must
    give the same answer: emulated bf16 is ~50x slower than float32, native bf16 is faster."""
    assert bf16_is_fast(torch.device("cpu")) == _measured_bf16_is_fast()


@pytest.mark.parametrize("vendor, intel", [("GenuineIntel", True), ("AuthenticAMD", False)])
def test_the_cpu_vendor_and_name_come_from_cpuinfo(tmp_path, monkeypatch, vendor, intel):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nvendor_id\t: {vendor}\ncpu family\t: 25\n"
                       "model\t\t: 17\nmodel name\t: A CPU\nflags\t\t: fpu avx2 avx512f\n\n"
                       "processor\t: 1\nvendor_id\t: Other\n")
    monkeypatch.setattr(vaswani.devices, "CPUINFO", str(cpuinfo))
    assert cpu_is_intel() is intel
    assert cpu_name() == "A CPU"
    assert cpu_generation() == "family 25, model 17"
    assert cpu_simd() == ["avx2", "avx512f"]
    assert bf16_is_fast(torch.device("cpu")) is False  # the flags say AVX2 only
    monkeypatch.setattr(vaswani.devices, "CPUINFO", str(tmp_path / "none"))
    assert cpu_is_intel() is False and cpu_name()  # no file: not Intel, a name from platform
    assert cpu_generation() is None and cpu_simd() == []


def test_a_childs_peak_memory_is_its_own_not_its_parents():
    """peak_resident_bytes is the process's own high-water mark. ru_maxrss, which the
    benchmarks' children once reported, carries over the parent's: with 400 MB held here, a
    small child's ru_maxrss says 400 MB or more (llama.cpp's Q4_1 and Q8_0 runs both read
    228 MB, the benchmark driver's size)."""
    import subprocess
    import sys

    from vaswani.devices import peak_resident_bytes

    held = torch.ones(100 * 2**20)  # 400 MB, written: resident
    assert peak_resident_bytes() > 400 * 2**20
    child = ("import resource; from vaswani.devices import peak_resident_bytes; "
             "print(peak_resident_bytes() // 2**20, "
             "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True).stdout.split()
    own, carried = int(out[0]), int(out[1])
    assert carried - own > 300, (own, carried)  # the child itself: torch, imported
    del held


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_blocks_between_kept_ones_are_given_back_to_the_kernel():
    """Blocks freed between blocks still in use stay resident (the heap gives back only its
    free top); give_back_freed_memory hands their pages back. In a child whose malloc keeps
    freed blocks (the command line's setting, cli/process.py): 40 blocks of 4 MB, each
    followed by a small block that stays, written, then freed."""
    import subprocess

    child = """
import torch
from vaswani.cli.process import keep_freed_memory
from vaswani.devices import give_back_freed_memory
keep_freed_memory()
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon"))
big, kept = [], []
for _ in range(40):
    big.append(torch.ones(2**20))  # 4 MB, written: resident
    kept.append(torch.ones(64))
del big
before = anon()
assert give_back_freed_memory()
print(before // 1024, anon() // 1024)
"""
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                         check=True).stdout.split()
    before, after = int(out[0]), int(out[1])
    assert before - after > 120, (before, after)  # MB: most of the 160 freed
