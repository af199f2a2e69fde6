"""A trained translator and its exports side by side: test sacreBLEU and sentences/s of
vaswani fp32 (eager, and with the decode step ``vaswani compile`` builds: built here first
if the run has none for this machine, its cold build timed), int8 (``--quantize int8``) and
bf16 (where this CPU runs bf16 natively),
CTranslate2 fp32 and int8 (and ONNX Runtime, greedy, with ``--onnx``), greedy and beam 4.

    python -m benchmarks.export RUN_DIR [--limit N] [--beams 1,4] [--rounds 2] [--onnx]
                                        [--json FILE]
    python -m benchmarks.export RUN_DIR --step-costs 1,8,64,256 [--json FILE]

Every engine runs in a process of its own, called as its own users call it (benchmarks/peers.py
says how): vaswani's ``translate``; CTranslate2's one ``translate_batch`` over every sentence
with its own sorting and batching (each of ``peers.CT2_BATCHINGS`` on each of its CPU backends,
``peers.CT2_BACKENDS``, with one worker and with a worker per core, ``peers.workers_for``,
tried once, its fastest kept; vaswani's rows likewise in one process and split across a
process per core, ``peers.vaswani_workers``, but bf16's) and the options the export's README
gives; ONNX Runtime's two graphs under a numpy greedy loop. Then the engines take turns,
``--rounds`` times, and each keeps its best time (peers.py ``race_at_best``). The sentences are the
run's test split. ``--length-penalty`` (default 0) is given to every engine: with 0 vaswani's
GNMT penalty and CTranslate2's are both the raw log-probability, so the outputs can agree, and
one length cap (the model's ``max_len - 1``) is given to both for the same reason
(``--run-defaults`` keeps vaswani's own per-sentence cap and length penalty instead). Output
agreement with CTranslate2 fp32 is reported beside the speed, not inside it.

``--step-costs ROWS`` instead times a greedy step at each number of rows: one test sentence
(the first whose reference is 40-80 tokens, else the longest) given R times, so every row
decodes as many steps; vaswani with ``batch_size`` R, CTranslate2 fp32 with ``max_batch_size``
R examples (its faster backend), each in its own process, alternating. A step's milliseconds
(the call's time, its one encoder pass included, over the steps) at 1 row say what a step costs
however few rows it has; the rise from there, per row, what each row adds.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from .common import step_sentence
from .peers import agreement, batchings, race_at_best, vaswani_workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--limit", type=int, default=0, help="the first N test sentences")
    parser.add_argument("--beams", default="1,4", help="beam sizes, comma-separated (1,4)")
    parser.add_argument("--length-penalty", type=float, default=0.0)
    parser.add_argument("--run-defaults", action="store_true",
                        help="vaswani with the run's own [decode] length cap and penalty")
    parser.add_argument("--threads", type=int, default=0, help="default: this CPU's cores")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per engine")
    parser.add_argument("--onnx", action="store_true", help="also ONNX Runtime (greedy)")
    parser.add_argument("--step-costs", metavar="ROWS",
                        help="only time a greedy step at these numbers of rows (1,8,64,256)")
    parser.add_argument("--eager-only", action="store_true",
                        help="leave vaswani's compiled decode step out")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    import torch

    import vaswani
    from vaswani.data.files import ReadReport, iter_translation
    from vaswani.data.registry import default_cache
    from vaswani.devices import bf16_is_fast
    from vaswani.evaluation.metrics import bleu_chrf
    from vaswani.export import export

    threads = args.threads or torch.get_num_threads()
    run = vaswani.load(args.run_dir)
    pairs = list(iter_translation(run.data_files("test", default_cache()), ReadReport()))
    pairs = pairs[:args.limit] if args.limit else pairs
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    cap = run.config.model.max_len - 1
    tmp = Path(tempfile.mkdtemp(prefix="vaswani-export-bench-"))
    export(args.run_dir, "ct2", tmp / "fp32")
    if args.step_costs:  # CTranslate2 fp32 only
        target = run.target_tokenizer or run.source_tokenizer
        write(step_costs(args, step_sentence(pairs, target), tmp, threads, cap,
                         lambda text: len(target.encode(text)) + 1), args.json)
        return
    export(args.run_dir, "ct2", tmp / "int8", quantize="int8")
    build_s = None if args.eager_only else compiled_step(args.run_dir)
    if args.onnx:
        export(args.run_dir, "onnx", tmp / "onnx")
    bf16 = bf16_is_fast(torch.device("cpu"))
    del run  # the children load their own

    results: dict[str, dict] = {}
    for beam in (int(b) for b in args.beams.split(",")):
        ours = {"beam": beam} if args.run_defaults else {
            "beam": beam, "length_penalty": args.length_penalty, "max_len_a": 0.0,
            "max_len_b": cap}
        common = {"task": "translate", "inputs": sources, "threads": threads}
        ct2 = {"beam_size": beam, "length_penalty": args.length_penalty,
               "max_decoding_length": cap}
        fp32 = {**common, "engine": "vaswani", "model": args.run_dir, "options": ours}
        jobs = vaswani_workers("vaswani fp32", fp32)  # one process, and one a core
        if build_s is not None:
            jobs.update(vaswani_workers("vaswani fp32 compiled", {**fp32, "compiled": True}))
        if bf16:  # (the child casts its own model: one process)
            jobs["vaswani bf16"] = {**fp32, "dtype": "bf16"}
        jobs.update(vaswani_workers("vaswani int8", {**fp32, "quantize": "int8"}))
        for precision, compute_type in [("fp32", "float32"), ("int8", "int8")]:
            jobs.update(batchings(f"CTranslate2 {precision}", {
                **common, "engine": "ctranslate2", "model": str(tmp / precision),
                "compute_type": compute_type, "options": ct2}))
        if args.onnx and beam == 1:
            jobs["ONNX Runtime fp32"] = {**common, "engine": "onnxruntime",
                                         "model": str(tmp / "onnx"), "options": {
                                             "max_len_a": 0.0, "max_len_b": cap}}
        raced = race_at_best(jobs, rounds=args.rounds)
        base, peer = raced["vaswani fp32"], raced["CTranslate2 fp32"]
        for name, r in raced.items():
            scores = bleu_chrf(r["outputs"], references)
            results[f"{name}, beam {beam}"] = {
                "engine": name, "beam": beam, "bleu": round(scores["bleu"], 2),
                "chrf": round(scores["chrf"], 2), "bleu_signature": scores["bleu_signature"],
                "sentences_per_s": r["per_s"], "rounds_s": r["rounds"],
                "speed_vs_ct2_fp32": round(peer["seconds"] / r["seconds"], 2),
                "same_as_ct2_fp32": round(agreement(r["outputs"], peer["outputs"]), 4),
                "settings": r["settings"], **({"setting": r["setting"],
                                               "per_s_by_setting": r["tried"]}
                                              if "tried" in r else {}),
                "examples": r["outputs"][:3]}
        for r in list(results.values())[-len(raced):]:
            r["bleu_vs_vaswani_fp32"] = round(
                r["bleu"] - results[f"vaswani fp32, beam {beam}"]["bleu"], 2)
        print(f"beam {beam}: vaswani fp32 {base['per_s']}/s, CTranslate2 fp32 "
              f"{peer['per_s']}/s", flush=True)

    print(f"\n{len(sources)} test sentences, {threads} threads, length penalty "
          f"{args.length_penalty}, each engine in its own process, best of {args.rounds}\n")
    int8 = {beam: results[f"vaswani int8, beam {beam}"]["sentences_per_s"]
            / results[f"CTranslate2 int8, beam {beam}"]["sentences_per_s"]
            for beam in {r["beam"] for r in results.values()}}
    print("| engine | beam | test BLEU | vs vaswani fp32 | sentences/s | vs CTranslate2 fp32 "
          "| same output as CTranslate2 fp32 |\n|---|---|---|---|---|---|---|")
    for r in results.values():
        setting = f" [{r['setting']}]" if "setting" in r else ""
        print(f"| {r['engine']}{setting} | {r['beam']} | {r['bleu']:.2f} | "
              f"{r['bleu_vs_vaswani_fp32']:+.2f} | {r['sentences_per_s']:.1f} | "
              f"{r['speed_vs_ct2_fp32']:.2f}x | {r['same_as_ct2_fp32']:.1%} |")
    for beam, ratio in sorted(int8.items()):
        print(f"\nbeam {beam}: vaswani int8 / CTranslate2 int8 {ratio:.2f}x")
    if not bf16:
        print("\nvaswani bf16: not run, this CPU has no native bf16 (AVX512-BF16/AMX)")
    summary = {"run_dir": args.run_dir, "sentences": len(sources), "threads": threads,
               "length_penalty": args.length_penalty, "rounds": args.rounds,
               "int8_over_ct2_int8": {str(b): round(r, 2) for b, r in sorted(int8.items())},
               "compiled_build_s": build_s,
               "engines": results}
    write(summary, args.json)


def compiled_step(run_dir: str) -> float:
    """The run's compiled decode step for this machine, built (cold) unless it is there
    already: the build's seconds (0.0: it was there)."""
    import vaswani

    try:
        vaswani.load(run_dir, compiled=True)
        return 0.0
    except FileNotFoundError:
        from vaswani.inference.compiled import compile_run

        _, seconds = compile_run(run_dir)
        print(f"built the compiled decode step in {seconds:.0f} s", flush=True)
        return round(seconds, 1)


def write(summary: dict, path: str | None) -> None:
    """The summary and this machine's description as JSON, where ``--json`` asks."""
    from .common import hardware

    if path:
        Path(path).write_text(json.dumps({**summary, "hardware": hardware()}, indent=2) + "\n")
        print(f"\nwrote {path}")


def step_costs(args, sentence: str, tmp: Path, threads: int, cap: int, steps_of) -> dict:
    """Milliseconds per greedy step at each number of rows in ``args.step_costs``, vaswani fp32
    and CTranslate2 fp32: ``sentence`` given R times (see the module's docstring);
    ``steps_of(output)`` counts an output's steps (its tokens and the end)."""
    rows = [int(r) for r in args.step_costs.split(",")]
    table: dict[str, dict] = {}
    for R in rows:
        common = {"task": "translate", "inputs": [sentence] * R, "threads": threads}
        jobs = {"vaswani": {**common, "engine": "vaswani", "model": args.run_dir, "options": {
            "beam": 1, "length_penalty": 0.0, "max_len_a": 0.0, "max_len_b": cap,
            "batch_size": R}}}
        jobs.update(batchings("CTranslate2", {
            **common, "engine": "ctranslate2", "model": str(tmp / "fp32"),
            "compute_type": "float32", "options": {"beam_size": 1, "length_penalty": 0.0,
                                                   "max_decoding_length": cap}},
            settings={f"{R} examples": {"max_batch_size": R, "batch_type": "examples"}},
            workers=(1,)))  # one batch: nothing to run side by side
        raced = race_at_best(jobs, rounds=args.rounds)
        ours, peer = raced["vaswani"], raced["CTranslate2"]
        steps = steps_of(ours["outputs"][0])
        table[str(R)] = {
            "steps": steps, "same_outputs": agreement(ours["outputs"], peer["outputs"]),
            "vaswani_ms_per_step": round(ours["seconds"] / steps * 1e3, 3),
            "ct2_ms_per_step": round(peer["seconds"] / steps * 1e3, 3),
            "ct2_setting": peer["setting"]}
    print(f"\none sentence given R times, greedy, {threads} threads, each engine in its own "
          f"process, best of {args.rounds}\n\n| rows | steps | vaswani ms/step | "
          "CTranslate2 ms/step | vaswani's time / CTranslate2's |\n|---|---|---|---|---|")
    for R, r in table.items():
        print(f"| {R} | {r['steps']} | {r['vaswani_ms_per_step']:.3f} | "
              f"{r['ct2_ms_per_step']:.3f} | "
              f"{r['vaswani_ms_per_step'] / r['ct2_ms_per_step']:.2f}x |")
    return {"run_dir": args.run_dir, "sentence": sentence, "threads": threads,
            "rounds": args.rounds, "rows": table}


if __name__ == "__main__":
    main()
