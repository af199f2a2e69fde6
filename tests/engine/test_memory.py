"""engine/memory.py: the cache in huge pages, the cyclic collector paused in an offline run."""

import sys

import pytest


@pytest.mark.parametrize("enabled", [True, False])
def test_an_offline_run_steps_with_the_cyclic_collector_paused_then_as_it_was(enabled):
    import gc

    import torch

    from vaswani import ModelConfig, build_model
    from vaswani.engine import Engine
    from vaswani.engine.request import Params, Request

    config = ModelConfig(arch="decoder", vocab_size=11, d_model=8, n_heads=2, d_ff=16,
                         n_layers=1, max_len=16)
    torch.manual_seed(0)
    engine = Engine(build_model(config).eval(), bos_id=1, eos_id=2)
    seen = []
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        engine.run([Request([3, 4, 5], Params(max_new_tokens=4, temperature=0))],
                   progress=lambda n: seen.append(gc.isenabled()))
        assert seen == [False] and gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


class Recorder:
    """Stands in for libc's madvise: records its calls, then calls the real one."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def __call__(self, *args):
        self.calls.append(args)
        self.real.argtypes, self.real.restype = self.argtypes, self.restype
        return self.real(*args)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_cache_tensors_are_zeros_aligned_to_a_huge_page_and_advised_before_use(monkeypatch):
    import torch

    from vaswani.engine import memory

    madvise = Recorder(memory.c_function("madvise"))
    monkeypatch.setattr(memory, "c_function",
                        lambda name: madvise if name == "madvise" else None)
    t = memory.zeros_in_huge_pages((4, 2, 1024, 64), torch.float32, torch.device("cpu"))
    assert t.shape == (4, 2, 1024, 64) and t.dtype == torch.float32 and t.is_contiguous()
    assert not t.any() and t.data_ptr() % memory.HUGE_PAGE == 0
    assert madvise.calls == [(t.data_ptr(), t.numel() * 4, memory.MADV_HUGEPAGE)]
    small = memory.zeros_in_huge_pages((3, 5), torch.bfloat16, torch.device("cpu"))
    assert small.dtype == torch.bfloat16 and not small.any() and len(madvise.calls) == 1


def test_a_slot_cache_on_this_machine_gets_huge_pages_where_the_kernel_gives_them():
    """The kernel's own account (/proc/self/smaps) of the memory under a cache tensor: asked
    to be backed by huge pages (THPeligible), and backed by them unless the kernel cannot
    find free 2 MiB blocks at that moment (where it does not say THPeligible: backed)."""
    import re
    from pathlib import Path

    import torch

    from vaswani.engine.cache import SlotCache

    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.exists() or "[never]" in mode.read_text():
        pytest.skip("no transparent huge pages on this system")
    c = SlotCache(2, 4, 64, tokens=8 * 4096, max_rows=8, max_len=4000, seq2seq=False,
                  dtype=torch.float32, device=torch.device("cpu"))
    c.resize(4096, 0, rows=8)  # 8 full slots: 8 MiB a tensor
    ptr = c.k[0].data_ptr()
    smaps = Path("/proc/self/smaps").read_text()
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", smaps):
        lo, hi = (int(x, 16) for x in block.split()[0].split("-"))
        if lo <= ptr < hi:  # asked for (THPeligible); given, unless memory is fragmented now
            eligible = re.search(r"THPeligible:\s+(\d)", block)
            assert eligible is None or eligible.group(1) == "1", block
            given = int(re.search(r"AnonHugePages:\s+(\d+) kB", block).group(1))
            assert given > 0 or eligible is not None, block
            return
    raise AssertionError("the cache's memory is in no mapping")
