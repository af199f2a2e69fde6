"""Offline decoding through the inference engine, against CTranslate2 on the same exported
model.

    python -m benchmarks.offline [--quick] [--json OUT.json] [--work DIR] [--profile [ROW]]

1,000 sentences (``vaswani translate``'s path: ``Translator.translate``), greedy and beam 4
(length penalty 0, one length cap of 64 tokens), against CTranslate2 on the run exported with
``vaswani export --format ct2``; 1,000 prompts (``generate_many``, 64 new tokens, greedy)
against its ``generate_batch``. Each engine runs in a process of its own, called as its users
call it (benchmarks/peers.py: CTranslate2 gets every input in one call and sorts and batches
them itself); they take turns twice and each keeps its best time. Each translation row is
raced with vaswani in one process and split across a process per core (``workers``), as
CTranslate2's with one worker and a worker per core, each at its faster. Outputs are compared apart
from the timing (the algorithms agree, beam search included). The same rows again in int8:
vaswani's ``quantize="int8"`` against CTranslate2's int8 export.

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

from .common import make_runs, report, sentence, test_pairs
from .peers import agreement, batchings, race_at_best, vaswani_workers


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
                **vaswani_workers("vaswani", {
                    **common, **ours, "model": str(runs["translator"]),
                    "options": {"beam": beam, "length_penalty": 0.0, "max_len_a": 0.0,
                                "max_len_b": CAP}}),
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
            "ctranslate2_per_s_by_setting": theirs["tried"],
            **({"vaswani_setting": ours["setting"], "vaswani_per_s_by_setting": ours["tried"]}
               if "tried" in ours else {})}


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
    args = parser.parse_args()
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
