"""The decode step's kernels, each against the way it replaced: the timings behind choices
in vaswani's CPU decoding path (experiments/README.md says which).

    python -m experiments.decode_kernels linear|burst|attention|cold-keys|top-k|first-max|
                                          cache-writes|frozen-linear [--json OUT.json]

``linear`` times a linear layer's two CPU inference paths: ``torch.nn.Linear`` (MKL) and
cpu/linear.py ``OneDNNLinear`` (oneDNN over a reordered copy of the weight; timed on any CPU,
though a model takes it on CPUs that are not Intel's only), for four weights and 1-512 rows.

``frozen-linear`` times a frozen weight's product in a training step, forward and the
input's gradient, at 512 rows (4 x 128 tokens, ``benchmarks.finetune``'s batch) for SmolLM2's
weights (q, k and v stacked; o; gate and up stacked; down; a block of 4,096 words of the
vocabulary projection): ``F.linear`` under autograd (MKL) and cpu/linear.py
``frozen_linear`` (oneDNN, what a LoRA base takes on CPUs that are not Intel's; timed on
any CPU), alternating; the input's gradients checked equal.

``burst`` times the step that prefills 14 prompts of 15-199 tokens arriving together
(the shakespeare-char preset's shape, ``max_len`` 512), with scheduler.py ``prefill_groups``
(rows of like lengths in separate passes, shortest first) and with every row in one padded
pass, alternating, four rounds; outputs compared.

``attention`` times a decoding step's attention by SDPA and written out (the choice
cpu/attention.py makes for ``auto``; and the written-out path's lean form under
inference, ``decoding_attention``) for four shapes: many rows over short keys, a beam
search's grouped queries, one row, and rows over long keys.

``cold-keys`` times a decoding step's attention (``decoding_attention``, 256 rows x 4
heads over 36 keys of 32 numbers) over keys the step has not read before (many copies,
cycled, more than the CPU's caches hold), in slots wider than the keys read (the engine's
cache) and packed (slots exactly as wide): what reading one (row, head)'s keys at a time from
memory costs.

``top-k`` times a beam step's first ranking: each row's 8 best of a 6,000-token
vocabulary's log-probabilities (the demo translator's), by ``Tensor.topk`` and by
engine/beam.py ``top_k`` (the maxima of V/8 columns first), at 64, 300 and 1,200 rows,
alternating; the two checked equal.

``first-max`` times a greedy step's choice: each row's best of a 6,000-token
vocabulary's logits, by ``Tensor.max`` and by generation/sampling.py ``first_max`` (the
maxima of blocks first), at 1-1,200 rows, alternating; the two checked equal.

``cache-writes`` times a decode step's cache writes (engine/views.py ``SlotKV.append``:
300 rows x 4 heads, each at its own column, into 8 tensors of 576 slots, as the
shakespeare-char row's four layers hold them), 120 MB read between steps as a step's other
work does, into tensors in 4 KiB pages (``torch.zeros``) and in huge pages
(engine/memory.py ``zeros_in_huge_pages``, what the cache uses), alternating.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from benchmarks.common import interleaved_best, ratio, report

WAYS = ("linear", "burst", "attention", "cold-keys", "top-k", "first-max", "cache-writes",
        "frozen-linear")


SHAPES = [(768, 256), (2000, 128), (8000, 256), (1536, 576)]  # (out, in) of a decode step


def linear_paths(shapes=SHAPES, rows=(1, 8, 64, 512), repeats: int = 5,
                 calls: int = 20) -> dict:
    """A linear layer's two CPU inference paths: ``torch.nn.Linear`` (``F.linear``: MKL) and
    cpu/linear.py ``OneDNNLinear`` with its oneDNN path on, whatever the CPU's vendor (oneDNN
    over the reordered copy of the weight where the product is large enough, else F.linear),
    fp32, in evaluation mode, for (out, in) weights of the presets (a layer of the bible
    preset, the demo's and the bible preset's vocabulary projections, a SmolLM2 feed-forward)
    at 1-512 rows; alternating, best of ``repeats`` x ``calls``; the products checked equal."""
    from vaswani.cpu.linear import OneDNNLinear

    out = {}
    for o, i in shapes:
        layer = OneDNNLinear(i, o).eval()
        layer.onednn = True  # this layer's option, whatever the CPU's vendor
        torch_layer = torch.nn.Linear(i, o).eval()
        torch_layer.load_state_dict(layer.state_dict())
        with torch.no_grad():
            out.update(two_ways(
                {f"{o} x {i}, {n} rows": torch.randn(n, i) for n in rows},
                "f_linear", torch_layer, "linear", layer,
                lambda want, got: torch.allclose(got, want, rtol=1e-4, atol=1e-4),
                repeats, calls))
    return out


FROZEN_SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536), (4096, 576)]  # SmolLM2's


def frozen_paths(shapes=FROZEN_SHAPES, rows: int = 512, repeats: int = 5,
                 calls: int = 5) -> dict:
    """A frozen weight's product in a training step, forward and the input's gradient, by
    ``F.linear`` under autograd and by cpu/linear.py ``frozen_linear``: the module's text."""
    import torch.nn.functional as F

    from vaswani.cpu.linear import frozen_linear

    def way(product, w):
        def run(x):
            x = x.detach().requires_grad_()
            out = product(x, w)
            out.backward(torch.ones_like(out))
            return x.grad
        return run

    out = {}
    for o, i in shapes:
        w = torch.randn(o, i) / i**0.5
        out.update(two_ways({f"{o} x {i}, {rows} rows": torch.randn(rows, i)},
                            "f_linear", way(F.linear, w), "frozen", way(frozen_linear, w),
                            lambda want, got: torch.allclose(got, want, rtol=1e-4, atol=1e-4),
                            repeats, calls))
    return out


ATTENTION_SHAPES = [(256, 1, 48, 32), (64, 4, 40, 32), (1, 1, 100, 64), (32, 1, 220, 64)]


def decode_attention(shapes=ATTENTION_SHAPES, heads: int = 4, repeats: int = 5,
                     calls: int = 50) -> dict:
    """A decoding step's attention, fp32, by PyTorch's SDPA, written out (nn/attention.py
    ``scaled_dot_product_attention``) and by ``decoding_attention`` (what the written-out
    path runs under inference: the same in fewer operations), for (rows, queries per row,
    keys, head dim): the keys a view of slots 176 wide, as the engine's cache holds them, a
    padding mask per row; alternating, best of ``repeats`` x ``calls``; outputs checked
    equal."""
    import torch.nn.functional as F

    from vaswani.cpu.attention import decoding_attention
    from vaswani.nn.attention import scaled_dot_product_attention

    out = {}
    for rows, queries, keys, dh in shapes:
        k, v = torch.randn(2, rows, heads, max(176, keys), dh)[:, :, :, :keys]
        q = torch.randn(rows, heads, queries, dh)
        mask = (torch.arange(keys) < torch.randint(1, keys + 1, (rows, 1)))[:, None, None]
        ways = [lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                lambda q, k, v, m: scaled_dot_product_attention(q, k, v, m)[0],
                decoding_attention]
        for way in ways[1:]:
            torch.testing.assert_close(way(q, k, v, mask), ways[0](q, k, v, mask),
                                       rtol=1e-4, atol=1e-4)
        best = [float("inf")] * len(ways)
        for _ in range(repeats):
            for i, fn in enumerate(ways):
                start = time.perf_counter()
                for _ in range(calls):
                    fn(q, k, v, mask)
                best[i] = min(best[i], (time.perf_counter() - start) / calls)
        out[f"{rows} rows x {queries} queries, {keys} keys, head dim {dh}"] = {
            "sdpa_ms": round(best[0] * 1e3, 3), "written_out_ms": round(best[1] * 1e3, 3),
            "decoding_ms": round(best[2] * 1e3, 3),
            "written_out_over_sdpa": ratio(best[1], best[0]),
            "decoding_over_written_out": ratio(best[2], best[1])}
    return out


def two_ways(shapes: dict[str, torch.Tensor], a: str, way_a, b: str, way_b, same,
             repeats: int = 5, calls: int = 20) -> dict:
    """Milliseconds of ``way_a(x)`` and ``way_b(x)`` for each x of ``shapes``, best of
    ``repeats`` x ``calls``, alternating; ``same(out_a, out_b)`` checked first."""
    out = {}
    for shape, x in shapes.items():
        if not same(way_a(x), way_b(x)):
            raise AssertionError(f"{b} differs from {a} at {shape}")
        best = [seconds / calls for seconds in interleaved_best(
            [lambda x=x, f=f: [f(x) for _ in range(calls)] for f in (way_a, way_b)], repeats)]
        out[shape] = {f"{a}_ms": round(best[0] * 1e3, 3), f"{b}_ms": round(best[1] * 1e3, 3),
                      f"{a}_over_{b}": ratio(best[0], best[1])}
    return out


def top_k_rows(rows=(64, 300, 1200), vocab: int = 6000, k: int = 8, repeats: int = 5,
               calls: int = 20) -> dict:
    """Milliseconds of ``Tensor.topk`` and engine/beam.py ``top_k`` over (rows, vocab)
    log-probabilities (:func:`two_ways`)."""
    from vaswani.engine.beam import top_k

    def same(want, got):
        return torch.equal(want.values, got[0]) and torch.equal(want.indices, got[1])

    return two_ways({f"{n} rows x {vocab}, k {k}": torch.randn(n, vocab).log_softmax(-1)
                     for n in rows}, "topk", lambda x: x.topk(k, dim=-1),
                    "top_k", lambda x: top_k(x, k), same, repeats, calls)


def first_max_rows(rows=(1, 8, 64, 256, 1200), vocab: int = 6000, repeats: int = 5,
                   calls: int = 20) -> dict:
    """Milliseconds of ``Tensor.max``'s indices and generation/sampling.py ``first_max`` over
    (rows, vocab) logits (:func:`two_ways`)."""
    from vaswani.generation.sampling import first_max

    return two_ways({f"{n} rows x {vocab}": torch.randn(n, vocab) for n in rows},
                    "max", lambda x: x.max(-1).indices, "first_max", first_max, torch.equal,
                    repeats, calls)


def cold_keys(rows: int = 256, heads: int = 4, keys: int = 36, dh: int = 32,
              widths=(36, 48, 176), bytes_cycled: float = 600e6, rounds: int = 3) -> dict:
    """Microseconds of ``decoding_attention`` over cold keys and values, and the GB/s of keys
    and values read, for slots of each of ``widths`` (``keys`` wide: packed), best of
    ``rounds`` passes over enough copies to fill ``bytes_cycled``."""
    from vaswani.cpu.attention import decoding_attention
    from vaswani.engine.memory import zeros_in_huge_pages

    q = torch.randn(rows, heads, 1, dh)
    read = 2 * rows * heads * keys * dh * 4  # bytes of keys and values a step reads
    out = {}
    for width in widths:
        copies = max(4, int(bytes_cycled / (2 * rows * heads * width * dh * 4)))
        kv = [zeros_in_huge_pages((2, rows, heads, width, dh), torch.float32,
                                  torch.device("cpu")).normal_() for _ in range(copies)]
        best = float("inf")
        for _ in range(rounds):
            start = time.perf_counter()
            for t in kv:
                decoding_attention(q, t[0, :, :, :keys], t[1, :, :, :keys])
            best = min(best, (time.perf_counter() - start) / copies)
        out[f"slots {width} wide" + (" (packed)" if width == keys else "")] = {
            "us": round(best * 1e6, 1), "gb_per_s": round(read / best / 1e9, 1)}
        del kv
    return out


def cache_writes(rounds: int = 4, steps: int = 40, tensors: int = 8, slots: int = 576,
                 rows: int = 300, heads: int = 4, width: int = 128, dh: int = 64,
                 between: int = 30_000_000) -> dict:
    """Microseconds per write of one step's keys into one cache tensor, best round, in 4 KiB
    pages and in huge pages (``between`` numbers read between steps); the huge pages the
    kernel gave (AnonHugePages, kB); whether both ways wrote the same numbers."""
    import re

    from vaswani.engine.memory import zeros_in_huge_pages
    from vaswani.engine.views import flat_index

    shape, cpu = (slots, heads, width, dh), torch.device("cpu")
    ways = {"4 KiB pages": lambda: torch.zeros(shape),
            "huge pages": lambda: zeros_in_huge_pages(shape, torch.float32, cpu)}
    keys, other = torch.randn(rows * heads, dh), torch.randn(between)
    starts = torch.randint(0, width - steps, (rows,), generator=torch.Generator().manual_seed(0))
    best = dict.fromkeys(ways, float("inf"))
    huge_kb, written = {}, {}
    for _ in range(rounds):
        for way, make in ways.items():
            caches = [make().view(-1, dh) for _ in range(tensors)]
            spent = 0.0
            for step in range(steps):
                index = flat_index(torch.arange(rows), (starts + step)[:, None], heads,
                                   width).view(-1)
                other.sum()  # the rest of a step: other memory through the caches
                start = time.perf_counter()
                for cache in caches:
                    cache.index_copy_(0, index, keys)
                spent += time.perf_counter() - start
            best[way] = min(best[way], spent / (steps * tensors))
            written[way] = [float(c.sum()) for c in caches]
            smaps = Path("/proc/self/smaps_rollup")
            if smaps.exists():
                huge_kb[way] = int(re.search(r"AnonHugePages:\s+(\d+)", smaps.read_text())[1])
            del caches
    return {"us_per_write": {way: round(t * 1e6, 1) for way, t in best.items()},
            "four_k_over_huge": ratio(best["4 KiB pages"], best["huge pages"]),
            "anon_huge_pages_kb_while_held": huge_kb,
            "same_writes": written["4 KiB pages"] == written["huge pages"]}


def prefill_burst(rounds: int = 4, n: int = 14, d_model: int = 256, layers: int = 4) -> dict:
    """The first step of an engine given ``n`` prompts of random lengths at once, its prefill
    rows grouped by length (the default ``prefill_slack``) or all in one pass (a slack no
    padding reaches); milliseconds per round."""
    from vaswani import ModelConfig, build_model
    from vaswani.engine import Engine, EngineConfig, Params, Request

    config = ModelConfig(arch="decoder", vocab_size=70, d_model=d_model, n_heads=4,
                         d_ff=4 * d_model, n_layers=layers, dropout=0.0, max_len=512,
                         norm_first=True, positional="learned", activation="gelu")
    torch.manual_seed(0)
    model = build_model(config).eval()
    rng = random.Random(0)
    lengths = [rng.randint(5, 200) for _ in range(n)]
    ways = {"one pass": EngineConfig(max_rows=32, prefill_slack=1 << 30),
            "grouped": EngineConfig(max_rows=32)}
    times: dict[str, list[float]] = {way: [] for way in ways}
    outputs: dict[str, list] = {}
    for _ in range(rounds):
        for way, engine_config in ways.items():
            engine = Engine(model, bos_id=1, eos_id=2, config=engine_config)
            requests = [Request([5 + i % 50 for i in range(k)], Params(max_new_tokens=4))
                        for k in lengths]
            for request in requests:
                engine.submit(request)
            start = time.perf_counter()
            engine.step()
            times[way].append(round((time.perf_counter() - start) * 1e3, 1))
            while engine.busy:
                engine.step()
            outputs[way] = [r.output for r in requests]
    return {"prompt_tokens": sorted(lengths), "first_step_ms": times,
            "one_pass_over_grouped": ratio(min(times["one pass"]), min(times["grouped"])),
            "same_outputs": outputs["one pass"] == outputs["grouped"]}


def versus_rows(timed: dict, a: str, b: str) -> list[tuple[str, str]]:
    """Report rows of a two-way timing: per shape, ``A_over_B``x (``A_ms`` ms / ``B_ms`` ms)."""
    return [(shape, f"{r[f'{a}_over_{b}']}x ({r[f'{a}_ms']} ms / {r[f'{b}_ms']} ms)")
            for shape, r in timed.items()]

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("which", choices=WAYS, help="the experiment (see the module's text)")
    parser.add_argument("--json", metavar="OUT.json")
    args = parser.parse_args()
    if args.which == "first-max":
        timed = first_max_rows()
        report("A greedy step's choice, each row's best token: Tensor.max / first_max",
               versus_rows(timed, "max", "first_max"), {"first_max": timed}, args.json)
        return
    if args.which == "top-k":
        timed = top_k_rows()
        report("A beam step's ranking, each row's 8 best tokens: Tensor.topk / beam.py top_k",
               versus_rows(timed, "topk", "top_k"), {"top_k": timed}, args.json)
        return
    if args.which == "cold-keys":
        timed = cold_keys()
        report("A decoding step's attention over keys it has not read yet (256 rows x 4 "
               "heads x 36 keys)", [(way, f"{r['us']} us, {r['gb_per_s']} GB/s")
                                    for way, r in timed.items()], {"cold_keys": timed},
               args.json)
        return
    if args.which == "cache-writes":
        timed = cache_writes()
        report("A decode step's cache writes (1,200 rows of 64 numbers, one tensor)",
               [*((way, f"{us} us") for way, us in timed["us_per_write"].items()),
                ("4 KiB / huge", f"{timed['four_k_over_huge']}x"),
                ("huge pages the kernel gave (kB)", str(timed["anon_huge_pages_kb_while_held"])),
                ("the same numbers written", str(timed["same_writes"]))],
               {"cache_writes": timed}, args.json)
        return
    if args.which == "attention":
        timed = decode_attention()
        report("A decoding step's attention (fp32): written out / SDPA, and "
               "decoding_attention / written out",
               versus_rows(timed, "written_out", "sdpa")
               + versus_rows(timed, "decoding", "written_out"), {"attention": timed},
               args.json)
        return
    if args.which == "burst":
        burst = prefill_burst()
        report("A burst of 14 prompts: the step that prefills them",
               [(way, f"{ms} ms") for way, ms in burst["first_step_ms"].items()]
               + [("one pass / grouped (best)", f"{burst['one_pass_over_grouped']}x; same "
                   f"outputs: {burst['same_outputs']}")], {"burst": burst}, args.json)
        return
    if args.which == "frozen-linear":
        timed = frozen_paths()
        report("A frozen weight's product in a training step, forward and the input's "
               "gradient (fp32): F.linear / cpu/linear.py frozen_linear",
               versus_rows(timed, "f_linear", "frozen"), {"frozen_linear": timed}, args.json)
        return
    if args.which == "linear":
        paths = linear_paths()
        report("A linear layer on a CPU (fp32): torch.nn.Linear / cpu/linear.py Linear",
               versus_rows(paths, "f_linear", "linear"), {"linear": paths}, args.json)
        return


if __name__ == "__main__":
    main()
