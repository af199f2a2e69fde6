"""What a translator's greedy decoding step could cost in PyTorch at best, beside what the
engine's step costs: the step written out in the fewest operators PyTorch has for it, run
eagerly and compiled by ``torch.compile`` (inductor, weights frozen, its C++ wrapper), and the
engine's own step.

    python -m experiments.step_floor RUN_DIR [--rows 1,4,64,256] [--no-compile] [--json FILE]
    python -m experiments.step_floor RUN_DIR --replay 300 [--json FILE]

The written-out step (:func:`written_out`) is one decoder pass for R rows of one token each,
with none of the engine's or the modules' Python: the embedding and its position, per layer a
norm, one q/k/v product, the new keys written into caches exactly as long as the keys read
(packed: no slot wider than its keys), SDPA, the output product and the residual; the same for
cross-attention over the source's keys and values, computed beforehand; the feed-forward
block; the final norm, the vocabulary product and each row's best token. Its logits equal the
model's (the test holds it to ``EncoderDecoder.decode`` with a cache). Eager, it is the floor
of a step dispatched operator by operator from Python; eager "in slots", the same over caches
as wide as the engine's widest slots (``max_len + 1`` columns, the demo's offline runs' from
their start), the keys read a view of their first columns, as the engine reads them;
compiled (packed caches), what inductor's generated
code makes of the same graph (each number of rows compiles once: the seconds of its first
call are reported). The engine's step is that of ``translate`` of one test sentence given R times,
greedy, ``batch_size`` R (as ``benchmarks.export --step-costs`` runs it, whose table holds
CTranslate2's step beside it): the call's time less that of the same call stopped after its
first token (its encoder pass and first step), over the steps after the first.
The sentence is the run's first test (or validation) sentence whose reference is 40-80
tokens (else its longest). The written-out step runs at its middle position (half its steps'
keys cached).
Each contender's best of ``--repeats`` timed rounds: the engine and the eager step alternate
in one process; the compiled step runs in a process of its own (once inductor's code has run
in a process, that process's eager steps are slower).

``--replay N`` prices a whole offline translation at the floor instead (:func:`replay`):
``translate`` of the first N test sentences, greedy, as ``benchmarks.export`` runs it, with
its encoder passes and each decoding step timed and each step's shape recorded (rows, the
longest row's position, the longest source); then the written-out step, packed, timed on
every recorded shape. What the run would take if every step cost no more than the floor: the
most any engine made of PyTorch's eager operators could gain on it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from benchmarks.common import ROOT, best_time, interleaved_best


def written_out(model):
    """``step(ids (R,), positions (R,), t, keys, values, cross_keys, cross_values)`` -> the
    logits (R, V) of an encoder-decoder ``model`` whose layers' keys and values for positions
    ``0 .. t - 1`` are in ``keys[i]``/``values[i]`` (R, H, >t, Dh) (column ``t`` is written)
    and whose source's are ``cross_keys[i]``/``cross_values[i]`` (R, H, S, Dh), per decoder
    layer i. Post-LN and pre-LN, ReLU or GELU, a sinusoidal or learned position; not RMS
    norms, grouped-query or rotary attention, or gated feed-forward blocks."""
    c, embed = model.config, model.tgt_embed
    if c.positional not in ("sinusoidal", "learned") or c.activation not in ("relu", "gelu") \
            or (c.n_kv_heads or c.n_heads) != c.n_heads or embed.norm is not None \
            or c.norm != "layernorm":
        raise ValueError("the written-out step covers translators with multi-head attention, "
                         "layer norms, sinusoidal or learned positions and ReLU/GELU "
                         "feed-forward blocks, not this model")
    D, H, pre = c.d_model, c.n_heads, c.norm_first
    table = embed.position.pe if c.positional == "sinusoidal" else embed.position.weight
    act = F.relu if c.activation == "relu" else F.gelu

    def norm(x: Tensor, module) -> Tensor:
        return F.layer_norm(x, (D,), module.weight, module.bias, module.eps)

    def block(x: Tensor, module, sublayer) -> Tensor:  # the residual, post-LN or pre-LN
        return x + sublayer(norm(x, module)) if pre else norm(x + sublayer(x), module)

    def step(ids, positions, t, keys, values, cross_keys, cross_values):
        R = ids.size(0)
        x = (F.embedding(ids, embed.token.weight) * embed.scale + table[positions])[:, None]
        for i, layer in enumerate(model.decoder.layers):
            a, ca, ff = layer.self_attn, layer.cross_attn, layer.feed_forward

            def self_attention(h, a=a, i=i):
                qkv = F.linear(h, a.in_proj.weight, a.in_proj.bias).view(R, 3, H, 1, D // H)
                keys[i][:, :, t:t + 1] = qkv[:, 1]
                values[i][:, :, t:t + 1] = qkv[:, 2]
                out = F.scaled_dot_product_attention(qkv[:, 0], keys[i][:, :, :t + 1],
                                                     values[i][:, :, :t + 1])
                return F.linear(out.view(R, 1, D), a.out_proj.weight, a.out_proj.bias)

            def cross_attention(h, a=ca, i=i):
                bias = None if a.in_proj.bias is None else a.in_proj.bias[:D]
                q = F.linear(h, a.in_proj.weight[:D], bias).view(R, 1, H, D // H)
                out = F.scaled_dot_product_attention(q.transpose(1, 2), cross_keys[i],
                                                     cross_values[i])
                return F.linear(out.view(R, 1, D), a.out_proj.weight, a.out_proj.bias)

            def feed_forward(h, ff=ff):
                h = act(F.linear(h, ff.linear1.weight, ff.linear1.bias))
                return F.linear(h, ff.linear2.weight, ff.linear2.bias)

            x = block(x, layer.self_block.norm, self_attention)
            x = block(x, layer.cross_block.norm, cross_attention)
            x = block(x, layer.ff_block.norm, feed_forward)
        if model.decoder.norm is not None:
            x = norm(x, model.decoder.norm)
        return F.linear(x[:, 0], model.output_proj.weight)

    return step


def state(model, rows: int, source: int, t: int, slots: bool = False) -> tuple:
    """Random ids and caches for ``rows`` rows at position ``t`` over a ``source``-token
    source, as :func:`written_out`'s step takes them: packed (each cache as long as the
    keys read), or with ``slots`` in tensors as wide as the engine's widest slots
    (engine/cache.py: ``max_len + 1`` and ``max_len`` columns, aligned), the keys a view."""
    from vaswani.engine.cache import aligned

    c = model.config
    H, Dh, L = c.n_heads, c.d_model // c.n_heads, len(model.decoder.layers)
    g = torch.Generator().manual_seed(0)

    def caches(width: int, wide: int) -> list[Tensor]:
        return [torch.randn(rows, H, wide if slots else width, Dh, generator=g)[:, :, :width]
                for _ in range(L)]

    ids = torch.randint(4, model.output_proj.weight.size(0), (rows,), generator=g)
    own, cross = aligned(c.max_len + 1), aligned(c.max_len)
    return (ids, torch.full((rows,), t), t, caches(t + 1, own), caches(t + 1, own),
            caches(source, cross), caches(source, cross))


def choose(step):
    """The step and each row's best token, as a decoding step ends."""
    return lambda *args: step(*args).max(-1).indices


def best_of(contenders: dict, repeats: int) -> dict[str, float]:
    """Each contender's best seconds per call over ``repeats`` rounds, the contenders
    alternating (common.py ``interleaved_best``); ``contenders``: name -> (a call, calls
    per round)."""
    rounds = [lambda fn=fn, n=n: [fn() for _ in range(n)] for fn, n in contenders.values()]
    seconds = interleaved_best(rounds, repeats)
    return {name: s / n for (name, (_, n)), s in zip(contenders.items(), seconds, strict=True)}


def greedy(run) -> dict:
    """``translate``'s options for a greedy decode as ``benchmarks.export`` runs it: length
    penalty 0 and the model's length cap."""
    return dict(beam=1, length_penalty=0.0, max_len_a=0.0, max_len_b=run.config.model.max_len - 1)


def replay(run, sentences: list[str], repeats: int) -> dict:
    """``translate`` of ``sentences`` (greedy, length penalty 0, the model's length cap),
    best of ``repeats`` runs, split into its encoder passes, its decoding steps (each step's
    best) and the rest; and the same steps written out (:func:`written_out`, packed caches,
    every row at its step's longest position and source), each timed best of ``repeats``."""
    from vaswani.engine.runner import Runner

    model = run.model.eval()
    options = greedy(run)
    decode, encode = Runner.decode, Runner.encode
    shapes: list[tuple[int, int, int]] = []  # a step's rows, longest position, longest source
    times: list[float] = []  # this run's seconds of each decoding step

    def timed_decode(self, rows):
        start = time.perf_counter()
        out = decode(self, rows)
        times.append(time.perf_counter() - start)
        shapes.append((len(rows), max(seq.cached for _, seq in rows),
                       max(len(request.prompt) for request, _ in rows)))
        return out

    def timed_encode(self, requests):
        start = time.perf_counter()
        encode(self, requests)
        encoding[0] += time.perf_counter() - start

    run.translate(sentences[:16], **options)  # warm-up
    best_total, best_encode, best_steps = float("inf"), float("inf"), None
    Runner.decode, Runner.encode = timed_decode, timed_encode
    try:
        for _ in range(repeats):
            shapes.clear()
            times.clear()
            encoding = [0.0]
            start = time.perf_counter()
            run.translate(sentences, **options)
            best_total = min(best_total, time.perf_counter() - start)
            best_encode = min(best_encode, encoding[0])
            best_steps = list(times) if best_steps is None else [
                min(a, b) for a, b in zip(best_steps, times, strict=True)]
    finally:
        Runner.decode, Runner.encode = decode, encode
    step = choose(written_out(model))
    floor = []
    with torch.inference_mode():
        for rows, position, source in shapes:
            inputs = state(model, rows, source, position)
            floor.append(best_time(lambda inputs=inputs: step(*inputs), repeats))
    by_rows = {}
    for lo, hi in [(1, 4), (5, 16), (17, 64), (65, 256), (257, 1 << 20)]:
        pick = [i for i, (rows, _, _) in enumerate(shapes) if lo <= rows <= hi]
        if pick:
            by_rows[f"{lo}-{hi}" if hi < 1 << 20 else f"{lo}+"] = {
                "steps": len(pick), "engine_s": round(sum(best_steps[i] for i in pick), 4),
                "written_out_s": round(sum(floor[i] for i in pick), 4)}
    steps_s = sum(best_steps)
    rest = max(0.0, best_total - best_encode - steps_s)
    return {"sentences": len(sentences), "steps": len(shapes),
            "row_steps": sum(rows for rows, _, _ in shapes), "repeats": repeats,
            "translate_s": round(best_total, 4), "encode_s": round(best_encode, 4),
            "decode_steps_s": round(steps_s, 4), "rest_s": round(rest, 4),
            "written_out_steps_s": round(sum(floor), 4),
            "translate_at_floor_s": round(best_encode + sum(floor) + rest, 4),
            "by_rows": by_rows}


def print_replay(r: dict) -> None:
    print(f"translate of {r['sentences']} sentences, greedy, best of {r['repeats']}: "
          f"{r['translate_s']:.3f} s = encoder passes {r['encode_s']:.3f} + {r['steps']} "
          f"decoding steps ({r['row_steps']:,} row-steps) {r['decode_steps_s']:.3f} + the "
          f"rest {r['rest_s']:.3f}")
    print(f"the same steps written out: {r['written_out_steps_s']:.3f} s; the run with them: "
          f"{r['translate_at_floor_s']:.3f} s ({r['sentences'] / r['translate_s']:.1f} -> "
          f"{r['sentences'] / r['translate_at_floor_s']:.1f} sentences/s)\n")
    print("| rows | steps | engine s | written out s |\n|---|---|---|---|")
    for rows, row in r["by_rows"].items():
        print(f"| {rows} | {row['steps']} | {row['engine_s']:.3f} | {row['written_out_s']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--rows", default="1,4,64,256", help="rows of a step (1,4,64,256)")
    parser.add_argument("--repeats", type=int, default=3, help="timed rounds per contender")
    parser.add_argument("--no-compile", action="store_true", help="the eager step only")
    parser.add_argument("--compiled-only", action="store_true",
                        help="(the child process) time the compiled step only, print JSON")
    parser.add_argument("--replay", type=int, metavar="N",
                        help="price translate of the first N test sentences at the floor")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    import vaswani
    from benchmarks.common import hardware, step_sentence, test_pairs

    run = vaswani.load(args.run_dir)
    model = run.model.eval()
    if args.replay:
        result = replay(run, [s for s, _ in test_pairs(run)][:args.replay], args.repeats)
        print_replay(result)
        if args.json:
            Path(args.json).write_text(json.dumps(
                {"run_dir": args.run_dir, "threads": torch.get_num_threads(), **result,
                 "hardware": hardware()}, indent=2) + "\n")
            print(f"\nwrote {args.json}")
        return
    target = run.target_tokenizer or run.source_tokenizer
    sentence = step_sentence(test_pairs(run), target)  # as export's --step-costs
    source = len(run.source_tokenizer.encode(sentence)) + 1
    options = greedy(run)
    steps = len(target.encode(run.translate([sentence], **options)[0])) + 1
    rows = [int(r) for r in args.rows.split(",")]
    eager = choose(written_out(model))
    if args.compiled_only:
        print(json.dumps(compiled_rows(model, eager, rows, source, steps, args.repeats)))
        return
    first = {**options, "max_len_b": 1}  # the encoder pass and the first step

    def translate(R: int, options: dict) -> list[str]:
        return run.translate([sentence] * R, batch_size=R, **options)

    table = {}
    with torch.inference_mode():
        for R in rows:
            inputs = state(model, R, source, steps // 2)
            wide = state(model, R, source, steps // 2, slots=True)
            calls = max(10, 300 // R)  # steps timed per round
            best = best_of({
                "engine": (lambda R=R: translate(R, options), max(1, calls // steps)),
                "engine, first step": (lambda R=R: translate(R, first), max(1, calls // steps)),
                "written out": (lambda inputs=inputs: eager(*inputs), calls),
                "written out in slots": (lambda wide=wide: eager(*wide), calls)},
                args.repeats)
            # a decoding step: the translation's time less its encoder pass and first step's
            best["engine"] = ((best["engine"] - best.pop("engine, first step"))
                              / max(1, steps - 1))
            table[str(R)] = {"steps": steps, **{
                f"{name.replace(' ', '_')}_ms_per_step": round(s * 1e3, 3)
                for name, s in best.items()}}
            print(f"{R} rows: {table[str(R)]}", flush=True)
    if not args.no_compile:  # in a process of its own: its generated code's threads slow
        # the eager steps of the process that ran it (the engine's 64-row step: 5.0 ms
        # against 3.9 once a compiled step had run beside it)
        child = [sys.executable, "-m", "experiments.step_floor", args.run_dir, "--rows",
                 args.rows, "--repeats", str(args.repeats), "--compiled-only"]
        done = subprocess.run(child, capture_output=True, text=True, check=True, cwd=ROOT)
        for R, row in json.loads(done.stdout.strip().splitlines()[-1]).items():
            table[R].update(row)
    print(f"\none test sentence ({steps} steps, {source} source tokens), greedy, best of "
          f"{args.repeats}; the written-out step at position {steps // 2}\n")
    names = ["engine", "written out", "written out in slots"] + (
        [] if args.no_compile else ["compiled"])
    print("| rows | " + " | ".join(f"{n} ms/step" for n in names)
          + " | engine / written out |" + ("" if args.no_compile else " compile s |")
          + "\n|---|" + "---|" * (len(names) + 1 + (not args.no_compile)))
    for R, r in table.items():
        print(f"| {R} | " + " | ".join(f"{r[n.replace(' ', '_') + '_ms_per_step']:.3f}"
                                      for n in names)
              + f" | {r['engine_ms_per_step'] / r['written_out_ms_per_step']:.2f}x |"
              + ("" if args.no_compile else f" {r['compile_s']} |"))
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"run_dir": args.run_dir, "sentence": sentence, "steps": steps,
             "source_tokens": source, "threads": torch.get_num_threads(),
             "repeats": args.repeats, "rows": table, "hardware": hardware()}, indent=2) + "\n")
        print(f"\nwrote {args.json}")


def compiled_rows(model, eager, rows: list[int], source: int, steps: int,
                  repeats: int) -> dict:
    """The written-out step compiled by inductor (weights frozen, its C++ wrapper; one
    compilation per number of rows): per number of rows, the first call's seconds (the
    compilation), whether its tokens are the eager step's, and its best ms per step."""
    import torch._inductor.config as inductor

    inductor.freezing, inductor.cpp_wrapper = True, True
    compiled = choose(torch.compile(written_out(model), dynamic=False))
    table = {}
    with torch.inference_mode():
        for R in rows:
            inputs = state(model, R, source, steps // 2)
            start = time.perf_counter()
            same = torch.equal(compiled(*inputs), eager(*inputs))
            seconds = time.perf_counter() - start
            best = best_of({"compiled": (lambda inputs=inputs: compiled(*inputs),
                                         max(10, 300 // R))}, repeats)
            table[str(R)] = {"compile_s": round(seconds, 1), "compiled_same_tokens": same,
                             "compiled_ms_per_step": round(best["compiled"] * 1e3, 3)}
    return table


if __name__ == "__main__":
    main()
