"""Offline decoding through the inference engine, against CTranslate2 on the same exported
model.

    python -m benchmarks.offline [--quick] [--json OUT.json] [--work DIR] [--profile [ROW]]
    python -m benchmarks.offline --linear [--json OUT.json]
    python -m benchmarks.offline --burst [--json OUT.json]
    python -m benchmarks.offline --attention [--json OUT.json]
    python -m benchmarks.offline --cache-writes [--json OUT.json]
    python -m benchmarks.offline --cold-keys [--json OUT.json]
    python -m benchmarks.offline --top-k [--json OUT.json]
    python -m benchmarks.offline --first-max [--json OUT.json]

1,000 sentences (``vaswani translate``'s path: ``Translator.translate``), greedy and beam 4
(length penalty 0, one length cap of 64 tokens), against CTranslate2 on the run exported with
``vaswani export --format ct2``; 1,000 prompts (``generate_many``, 64 new tokens, greedy)
against its ``generate_batch``. Each engine runs in a process of its own, called as its users
call it (benchmarks/peers.py: CTranslate2 gets every input in one call and sorts and batches
them itself); they take turns twice and each keeps its best time. Outputs are compared apart
from the timing (the algorithms agree, beam search included). The same rows again in int8:
vaswani's ``quantize="int8"`` against CTranslate2's int8 export.

``--linear`` only times a linear layer's two CPU inference paths: ``torch.nn.Linear`` (MKL) and
cpu/linear.py ``OneDNNLinear`` (oneDNN over a reordered copy of the weight; timed on any CPU,
though a model takes it on CPUs that are not Intel's only), for four weights and 1-512 rows.

``--burst`` only times the step that prefills 14 prompts of 15-199 tokens arriving together
(the shakespeare-char preset's shape, ``max_len`` 512), with scheduler.py ``prefill_groups``
(rows of like lengths in separate passes, shortest first) and with every row in one padded
pass, alternating, four rounds; outputs compared.

``--attention`` only times a decoding step's attention by SDPA and written out (the choice
cpu/attention.py makes for ``auto``; and the written-out path's lean form under
inference, ``decoding_attention``) for four shapes: many rows over short keys, a beam
search's grouped queries, one row, and rows over long keys.

``--cold-keys`` only times a decoding step's attention (``decoding_attention``, 256 rows x 4
heads over 36 keys of 32 numbers) over keys the step has not read before (many copies,
cycled, more than the CPU's caches hold), in slots wider than the keys read (the engine's
cache) and packed (slots exactly as wide): what reading one (row, head)'s keys at a time from
memory costs.

``--top-k`` only times a beam step's first ranking: each row's 8 best of a 6,000-token
vocabulary's log-probabilities (the demo translator's), by ``Tensor.topk`` and by
engine/beam.py ``top_k`` (the maxima of V/8 columns first), at 64, 300 and 1,200 rows,
alternating; the two checked equal.

``--first-max`` only times a greedy step's choice: each row's best of a 6,000-token
vocabulary's logits, by ``Tensor.max`` and by generation/sampling.py ``first_max`` (the
maxima of blocks first), at 1-1,200 rows, alternating; the two checked equal.

``--cache-writes`` only times a decode step's cache writes (engine/views.py ``SlotKV.append``:
300 rows x 4 heads, each at its own column, into 8 tensors of 576 slots, as the
shakespeare-char row's four layers hold them), 120 MB read between steps as a step's other
work does, into tensors in 4 KiB pages (``torch.zeros``) and in huge pages
(engine/memory.py ``zeros_in_huge_pages``, what the cache uses), alternating.

``--profile [lm|translate|beam]`` runs only torch.profiler over the LM row (300 prompts),
greedy translation or beam-4 translation (300 sentences; ``--profile-run RUN_DIR``: that
translator's first 300 test sentences) and prints the share of the linear layers, attention,
the cache's writes and copies, choosing tokens, and the rest; then the time,
minor page faults and kernel time of the same work without the profiler (engine/memory.py;
``GLIBC_TUNABLES= python -m benchmarks.offline --profile beam`` shows them with glibc's
defaults).

The models are those of benchmarks/serve.py (the bible preset's and the shakespeare-char
preset's size, effectively random weights: outputs run to their length cap), fp32, on this
machine's CPU threads.
"""

from __future__ import annotations

import argparse
import random
import resource
import tempfile
import time
from pathlib import Path

import torch

from .common import interleaved_best, make_runs, report, sentence, test_pairs
from .peers import agreement, batchings, race_at_best


def against_ct2(work: Path, n: int, threads: int, rounds: int = 2,
                precisions: tuple[str, ...] = ("fp32", "int8")) -> dict:
    """The translator (greedy and beam 4, length penalty 0, one length cap of ``CAP`` tokens
    on both sides: its effectively random weights run every output to the cap) and the
    language model (64 new tokens, greedy) against CTranslate2 on their exports, in float32
    and in int8 (vaswani's ``quantize="int8"``, CTranslate2's int8 export and compute type),
    each engine in a process of its own (peers.py), CTranslate2 at its fastest batch setting
    and backend (picked in a first round), then each engine best of ``rounds`` alternating
    (peers.py ``race_at_best``); outputs compared (int8 rounds differently in the two
    engines: their outputs may differ)."""
    from vaswani.export import export

    runs = make_runs(work)
    rng = random.Random(3)
    sources = [sentence(rng) for _ in range(n)]
    # prompts that leave room for the 64 new tokens in the 128 positions of the char model:
    # CTranslate2 cannot slide its window, vaswani would (and the outputs would differ)
    prompts = [sentence(rng, 3, 12)[:60] for _ in range(n)]
    folder = Path(tempfile.mkdtemp(prefix="vaswani-offline-"))
    out = {}
    for precision in precisions:
        quantize = "int8" if precision == "int8" else None
        for name, run_dir in runs.items():
            export(run_dir, "ct2", folder / precision / name, quantize=quantize)
        ours = {"engine": "vaswani", "quantize": quantize, "threads": threads}
        theirs = {"engine": "ctranslate2", "threads": threads,
                  "compute_type": "int8" if quantize else "float32"}
        for beam in (1, 4):
            common = {"task": "translate", "inputs": sources}
            out[f"translate {n} sentences, beam {beam}, {precision}"] = versus(race_at_best({
                "vaswani": {**common, **ours, "model": str(runs["translator"]),
                            "options": {"beam": beam, "length_penalty": 0.0,
                                        "max_len_a": 0.0, "max_len_b": CAP}},
                **batchings("ctranslate2", {
                    **common, **theirs, "model": str(folder / precision / "translator"),
                    "options": {"beam_size": beam, "length_penalty": 0.0,
                                "max_decoding_length": CAP}})}, rounds))
        common = {"task": "generate", "inputs": prompts}
        out[f"generate {n} prompts, greedy, {precision}"] = versus(race_at_best({
            "vaswani": {**common, **ours, "model": str(runs["lm"]),
                        "options": {"max_new_tokens": 64, "temperature": 0}},
            **batchings("ctranslate2", {**common, **theirs, "model": str(folder / precision / "lm"),
                                        "options": {"max_length": 64}})}, rounds))
    return out


CAP = 64  # tokens a translation may have at most, on both sides


def versus(raced: dict) -> dict:
    ours, theirs = raced["vaswani"], raced["ctranslate2"]
    return {"per_s": {"vaswani": ours["per_s"], "ctranslate2": theirs["per_s"]},
            "rounds_s": {"vaswani": ours["rounds"], "ctranslate2": theirs["rounds"]},
            "vaswani_over_ct2": round(theirs["seconds"] / ours["seconds"], 2),
            "same_outputs": agreement(ours["outputs"], theirs["outputs"]),
            "ctranslate2_settings": theirs["settings"],
            "ctranslate2_per_s_by_setting": theirs["tried"]}


def profile_row(work: Path, row: str = "lm", n: int = 300, run_dir: str | None = None) -> dict:
    """Where the engine's time goes in a row (``lm``: ``generate_many`` of ``n`` of its
    prompts; ``translate`` / ``beam``: greedy / beam-4 ``translate`` of ``n`` of its
    sentences, or with ``run_dir``, of that translator's first ``n`` test (or
    validation) sentences):
    torch.profiler's self CPU time of the operators by kind, as shares; and from a pass
    without the profiler, its time, minor page faults and kernel time (what engine/memory.py
    is about)."""
    from torch.profiler import profile

    import vaswani

    rng = random.Random(3)
    if run_dir is not None:
        if row == "lm":
            raise ValueError("--profile-run takes a translator: profile it with translate "
                             "or beam")
        run = vaswani.load(run_dir)
        prompts = [source for source, _ in test_pairs(run)][:n]

        def work_once(texts):
            return run.translate(texts, beam=4 if row == "beam" else 1, length_penalty=0.0)
    elif row == "lm":
        run = vaswani.load(make_runs(work)["lm"])
        prompts = [sentence(rng, 3, 12)[:60] for _ in range(n)]

        def work_once(texts):
            return run.generate_many(texts, max_new_tokens=64, temperature=0)
    else:
        run = vaswani.load(make_runs(work)["translator"])
        prompts = [sentence(rng) for _ in range(n)]

        def work_once(texts):
            return run.translate(texts, beam=4 if row == "beam" else 1, length_penalty=0.0)
    work_once(prompts[:32])  # warm up
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    work_once(prompts)  # unprofiled: the time, and the allocator's page faults
    after, seconds = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    with profile() as prof:
        work_once(prompts)
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    kinds = {"linear layers (addmm, mm, oneDNN)":
                 lambda k: k in ("aten::addmm", "aten::mm", "mkldnn::_linear_pointwise",
                                 "quantized::linear_dynamic", "aten::_weight_int8pack_mm",
                                 "aten::_weight_int4pack_mm_for_cpu"),
             "attention (SDPA, or written out: bmm, softmax)":
                 lambda k: "scaled_dot_product" in k or k in ("aten::bmm", "aten::_softmax"),
             "KV cache writes and copies (index_put, index, index_copy)":
                 lambda k: k in ("aten::index_put_", "aten::_index_put_impl_", "aten::index",
                                 "aten::index_select", "aten::index_copy_"),
             "choosing tokens (argmax, log-softmax, top-k)":  # first_max: amax, max;
                 lambda k: k in ("aten::argmax", "aten::max", "aten::amax",  # top_k: gather
                                 "aten::_log_softmax", "aten::topk", "aten::gather")}
    shares = {kind: sum(e.self_cpu_time_total for e in events if match(e.key)) / total
              for kind, match in kinds.items()}
    shares["everything else"] = 1 - sum(shares.values())
    return {"shares": {kind: round(share, 4) for kind, share in shares.items()},
            "seconds": round(seconds, 2),  # the unprofiled pass, and its page faults
            "minor_page_faults": after.ru_minflt - before.ru_minflt,
            "kernel_seconds": round(after.ru_stime - before.ru_stime, 2)}


SHAPES = [(768, 256), (2000, 128), (8000, 256), (1536, 576)]  # (out, in) of a decode step


def linear_paths(shapes=SHAPES, rows=(1, 8, 64, 512), repeats: int = 5,
                 calls: int = 20) -> dict:
    """A linear layer's two CPU inference paths: ``torch.nn.Linear`` (``F.linear``: MKL) and
    cpu/linear.py ``OneDNNLinear`` with its oneDNN path on, whatever the CPU's vendor (oneDNN
    over the reordered copy of the weight where the product is large enough, else F.linear),
    fp32, in evaluation mode, for (out, in) weights of the presets (a layer of the bible
    preset, the demo's and the bible preset's vocabulary projections, a SmolLM2 feed-forward)
    at 1-512 rows; alternating, best of ``repeats`` x ``calls``; the products checked equal."""
    import vaswani.cpu.linear
    from vaswani.cpu.linear import OneDNNLinear

    chosen, vaswani.cpu.linear.USE_ONEDNN = vaswani.cpu.linear.USE_ONEDNN, True
    try:
        return _linear_paths(OneDNNLinear, shapes, rows, repeats, calls)
    finally:
        vaswani.cpu.linear.USE_ONEDNN = chosen


def _linear_paths(Linear, shapes, rows, repeats, calls) -> dict:
    out = {}
    for o, i in shapes:
        layer = Linear(i, o).eval()
        torch_layer = torch.nn.Linear(i, o).eval()
        torch_layer.load_state_dict(layer.state_dict())
        with torch.no_grad():
            out.update(two_ways(
                {f"{o} x {i}, {n} rows": torch.randn(n, i) for n in rows},
                "f_linear", torch_layer, "linear", layer,
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
            "written_out_over_sdpa": round(best[1] / best[0], 2),
            "decoding_over_written_out": round(best[2] / best[1], 2)}
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
                      f"{a}_over_{b}": round(best[0] / best[1], 2)}
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
            "four_k_over_huge": round(best["4 KiB pages"] / best["huge pages"], 2),
            "anon_huge_pages_kb_while_held": huge_kb,
            "same_writes": written["4 KiB pages"] == written["huge pages"]}


def prefill_burst(rounds: int = 4, n: int = 14, d_model: int = 256, layers: int = 4) -> dict:
    """The first step of an engine given ``n`` prompts of random lengths at once, its prefill
    rows grouped by length (``prefill_groups``) or all in one pass; milliseconds per round."""
    import vaswani.engine.engine as engine_module
    from vaswani import ModelConfig, build_model
    from vaswani.engine import Engine, EngineConfig, Params, Request

    config = ModelConfig(arch="decoder", vocab_size=70, d_model=d_model, n_heads=4,
                         d_ff=4 * d_model, n_layers=layers, dropout=0.0, max_len=512,
                         norm_first=True, positional="learned", activation="gelu")
    torch.manual_seed(0)
    model = build_model(config).eval()
    rng = random.Random(0)
    lengths = [rng.randint(5, 200) for _ in range(n)]
    ways = {"one pass": lambda rows, slack=32: [rows] if rows else [],
            "grouped": engine_module.prefill_groups}
    times: dict[str, list[float]] = {way: [] for way in ways}
    outputs: dict[str, list] = {}
    try:
        for _ in range(rounds):
            for way, groups in ways.items():
                engine_module.prefill_groups = groups
                engine = Engine(model, bos_id=1, eos_id=2, config=EngineConfig(max_rows=32))
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
    finally:
        engine_module.prefill_groups = ways["grouped"]
    return {"prompt_tokens": sorted(lengths), "first_step_ms": times,
            "one_pass_over_grouped": round(min(times["one pass"]) / min(times["grouped"]), 2),
            "same_outputs": outputs["one pass"] == outputs["grouped"]}


def versus_rows(timed: dict, a: str, b: str) -> list[tuple[str, str]]:
    """Report rows of a two-way timing: per shape, ``A_over_B``x (``A_ms`` ms / ``B_ms`` ms)."""
    return [(shape, f"{r[f'{a}_over_{b}']}x ({r[f'{a}_ms']} ms / {r[f'{b}_ms']} ms)")
            for shape, r in timed.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 sentences, fewer rounds")
    parser.add_argument("--json", metavar="OUT.json")
    parser.add_argument("--work", metavar="DIR", help="where the runs go (default: a temp dir)")
    parser.add_argument("--profile", nargs="?", const="lm", choices=["lm", "translate", "beam"],
                        help="only profile one row (default lm; translate: greedy "
                        "translation; beam: beam 4): the share of each kind of operator")
    parser.add_argument("--profile-run", metavar="RUN_DIR",
                        help="with --profile translate|beam: profile this translator over its "
                        "test sentences instead of the preset-sized one")
    parser.add_argument("--linear", action="store_true",
                        help="only time a linear layer's two CPU paths, F.linear and oneDNN")
    parser.add_argument("--burst", action="store_true",
                        help="only time a burst's prefill step, rows grouped or in one pass")
    parser.add_argument("--attention", action="store_true",
                        help="only time a decoding step's attention, SDPA or written out")
    parser.add_argument("--cache-writes", action="store_true",
                        help="only time a decode step's cache writes, 4 KiB or huge pages")
    parser.add_argument("--cold-keys", action="store_true",
                        help="only time a decoding step's attention over keys not yet read")
    parser.add_argument("--top-k", action="store_true",
                        help="only time a beam step's ranking: topk against beam.py's top_k")
    parser.add_argument("--first-max", action="store_true",
                        help="only time a greedy step's choice: max against first_max")
    args = parser.parse_args()
    if args.first_max:
        timed = first_max_rows()
        report("A greedy step's choice, each row's best token: Tensor.max / first_max",
               versus_rows(timed, "max", "first_max"), {"first_max": timed}, args.json)
        return
    if args.top_k:
        timed = top_k_rows()
        report("A beam step's ranking, each row's 8 best tokens: Tensor.topk / beam.py top_k",
               versus_rows(timed, "topk", "top_k"), {"top_k": timed}, args.json)
        return
    if args.cold_keys:
        timed = cold_keys()
        report("A decoding step's attention over keys it has not read yet (256 rows x 4 "
               "heads x 36 keys)", [(way, f"{r['us']} us, {r['gb_per_s']} GB/s")
                                    for way, r in timed.items()], {"cold_keys": timed},
               args.json)
        return
    if args.cache_writes:
        timed = cache_writes()
        report("A decode step's cache writes (1,200 rows of 64 numbers, one tensor)",
               [*((way, f"{us} us") for way, us in timed["us_per_write"].items()),
                ("4 KiB / huge", f"{timed['four_k_over_huge']}x"),
                ("huge pages the kernel gave (kB)", str(timed["anon_huge_pages_kb_while_held"])),
                ("the same numbers written", str(timed["same_writes"]))],
               {"cache_writes": timed}, args.json)
        return
    if args.attention:
        timed = decode_attention()
        report("A decoding step's attention (fp32): written out / SDPA, and "
               "decoding_attention / written out",
               versus_rows(timed, "written_out", "sdpa")
               + versus_rows(timed, "decoding", "written_out"), {"attention": timed},
               args.json)
        return
    if args.burst:
        burst = prefill_burst()
        report("A burst of 14 prompts: the step that prefills them",
               [(way, f"{ms} ms") for way, ms in burst["first_step_ms"].items()]
               + [("one pass / grouped (best)", f"{burst['one_pass_over_grouped']}x; same "
                   f"outputs: {burst['same_outputs']}")], {"burst": burst}, args.json)
        return
    if args.linear:
        paths = linear_paths()
        report("A linear layer on a CPU (fp32): torch.nn.Linear / cpu/linear.py Linear",
               versus_rows(paths, "f_linear", "linear"), {"linear": paths}, args.json)
        return
    work = Path(args.work or tempfile.mkdtemp(prefix="vaswani-bench-offline-"))
    work.mkdir(parents=True, exist_ok=True)
    if args.profile:
        row = profile_row(work, args.profile, run_dir=args.profile_run)
        report(f"Where the {args.profile} row's time goes (self CPU time)",
               [*((kind, f"{share:.0%}") for kind, share in row["shares"].items()),
                ("time without the profiler", f"{row['seconds']} s"),
                ("minor page faults, kernel time", f"{row['minor_page_faults']:,}, "
                                                   f"{row['kernel_seconds']} s")],
               {f"profile_{args.profile}": row}, args.json)
        return
    results = {}
    try:
        import ctranslate2  # noqa: F401

        results["ctranslate2"] = against_ct2(work, 200 if args.quick else 1000,
                                             torch.get_num_threads())
    except ImportError:
        results["ctranslate2"] = "not run: pip install 'vaswani[export]'"
    rows = []
    ct2 = results["ctranslate2"]
    for name, r in ct2.items() if isinstance(ct2, dict) else []:
        same = f"; same outputs {r['same_outputs']:.0%}" if "same_outputs" in r else ""
        rows.append((f"{name}: vaswani / CTranslate2",
                     f"{r['vaswani_over_ct2']}x ({r['per_s']} per s{same})"))
    report("Offline decoding (CPU)", rows, results, args.json)


if __name__ == "__main__":
    main()
