"""Sharded training against data-parallel training: per-rank memory and step time.

    python -m benchmarks.distributed [--quick] [--startup-only] [--nproc 2]
                                     [--device cpu|cuda] [--cap-mib MIB] [--json OUT.json]

Trains a decoder-only language model (d 768, 8 layers, vocabulary 32,000: 81M parameters;
``--quick``: d 128, 2 layers) with vaswani's own ``Trainer`` on ``--nproc`` processes in
three modes: ``parallel = "ddp"``, ``"fsdp"`` and ``"fsdp"`` with ``checkpoint_activations``,
the same global batch each (gloo between CPU processes, NCCL between GPUs). For each mode and
rank it reports:

* the bytes the rank holds in parameters, gradients and AdamW state, counted from the tensors
  themselves after a step (a DTensor counts its local slice): what sharding divides;
* the peak memory at start-up (the ``Trainer`` made: the model built, sharded, its weights
  initialised) and over the whole run: CUDA's max allocated on a GPU, the peak resident set on
  a CPU (which adds the interpreter, the libraries and the data). FSDP builds the model on the
  meta device and each rank allocates its slices only, so its start-up peak is the slices,
  not the model; ``--startup-only`` measures that alone (no training steps);
* the median optimizer-step time over the timed steps, after warm-up.

``--cap-mib`` is the memory budget a rank is given for its training state (default: 3/4 of
what DDP needs at this size, so DDP does not fit and FSDP does); the table says which modes
fit. On a GPU the cap could be enforced with ``torch.cuda.set_per_process_memory_fraction``;
here it is compared, not enforced.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from vaswani.devices import peak_resident_bytes

from .common import hardware
from .ports import free_port

MODES = {"ddp": {"parallel": "ddp"}, "fsdp": {"parallel": "fsdp"},
         "fsdp+checkpointing": {"parallel": "fsdp", "checkpoint_activations": True}}


def _config(folder: Path, quick: bool, device: str, train: dict) -> Path:
    from vaswani.config import dump_toml

    text = folder / "text.txt"
    if not text.exists():
        import random

        rng = random.Random(0)
        text.write_text("".join(rng.choice("abcdefghij klmnop\n") for _ in range(200_000)))
    model = ({"d_model": 128, "n_heads": 4, "d_ff": 512, "n_layers": 2}
             if quick else {"d_model": 768, "n_heads": 12, "d_ff": 3072, "n_layers": 8})
    sections = {
        "model": {"arch": "decoder", "dropout": 0.0, "max_len": 256, **model},
        "data": {"train": str(text), "tokenizer": "char", "batch_size": 8, "block_size": 128},
        "train": {"device": device, "max_steps": 100, "lr": 1e-4, "warmup": 1,
                  "schedule": "constant", "log_every": 1000, "eval_every": 1000,
                  "save_every": 1000, **train}}
    path = folder / f"{'-'.join(map(str, train.values())) or 'base'}.toml"
    path.write_text(dump_toml(sections))
    return path


def _peak(device: torch.device) -> int:
    """The process's peak memory so far: CUDA's max allocated on a GPU, the peak resident
    set on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    return peak_resident_bytes()


def _worker(rank: int, world: int, port: int, cfg_path: str, cache: str, steps: int,
            out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // world))
    from vaswani import devices
    from vaswani.config import load_run_config
    from vaswani.tasks import task_for
    from vaswani.training import distributed, sharding
    from vaswani.training.loop import Trainer
    from vaswani.training.train import resolve_model

    cfg = load_run_config(cfg_path)
    device = devices.resolve_device(cfg.train.device, rank)
    dist = distributed.init(rank, world, rank, device, group_of_one=True)
    task = task_for(cfg)
    data = task.load(Path(cache), progress=False)
    cfg = resolve_model(cfg, task, data)
    if cfg.model.d_model > 128:  # the char tokenizer's ~20 symbols, padded to an LLM's 32,000
        cfg = cfg.replace(model=cfg.model.replace(vocab_size=32_000))
    run_dir = Path(out).parent / f"run-{Path(out).stem}"
    run_dir.mkdir(exist_ok=True)
    trainer = Trainer(cfg, task, data, run_dir, device=device, dist=dist, progress=False)
    startup = _peak(device)  # the model built (and sharded), before the first step
    times, state = [], {}
    for step in range(steps + 2 if steps else 0):  # two warm-up steps
        if device.type == "cuda":
            torch.cuda.synchronize()
        began = time.perf_counter()
        micro = [trainer.batches.micro_batch(step).to(device)]
        trainer.accumulate(micro)
        grads = sharding.training_bytes(trainer.model, trainer.optimizer)["gradients"]
        trainer.optimizer_step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        if step >= 2:
            times.append(time.perf_counter() - began)
        state = {**sharding.training_bytes(trainer.model, trainer.optimizer),
                 "gradients": grads}
    if state:
        state["total"] = state["parameters"] + state["gradients"] + state["optimizer"]
    Path(out).write_text(json.dumps({"rank": rank, "state_bytes": state,
                                     "startup_peak_bytes": startup, "peak_bytes": _peak(device),
                                     "step_s": statistics.median(times) if times else None,
                                     "parameters": sum(p.numel() for p in
                                                       trainer.model.parameters())}))
    dist.barrier()  # every collective done; the model goes before the group (distributed.shutdown)
    del trainer
    gc.collect()
    distributed.shutdown(dist)


def run_mode(name: str, folder: Path, args) -> list[dict]:
    from vaswani.config import load_run_config
    from vaswani.tasks import task_for

    cfg_path = _config(folder, args.quick, args.device,
                       {"parallel": MODES[name]["parallel"],
                        "checkpoint_activations": MODES[name].get("checkpoint_activations",
                                                                  False)})
    task_for(load_run_config(cfg_path)).load(folder / "cache", progress=False)  # once
    outs = [folder / f"{name}-{r}.json" for r in range(args.nproc)]
    ctx = mp.get_context("spawn")
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, args.nproc, port, str(cfg_path),
                                               str(folder / "cache"), args.steps, str(outs[r])))
             for r in range(args.nproc)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=args.timeout)
        if p.exitcode != 0:
            for q in procs:
                q.kill()
            raise RuntimeError(f"{name}: a worker failed (exit code {p.exitcode})")
    return [json.loads(o.read_text()) for o in outs]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a small model (a smoke run)")
    parser.add_argument("--nproc", type=int, default=2, help="processes (default 2)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (one GPU per process)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 5; 2 "
                        "with --quick)")
    parser.add_argument("--startup-only", action="store_true",
                        help="only the memory at start-up (no training steps)")
    parser.add_argument("--cap-mib", type=float, default=None,
                        help="a rank's budget for its training state (default: 3/4 of DDP's)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mode")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    args.steps = 0 if args.startup_only else args.steps or (2 if args.quick else 5)
    results: dict = {"nproc": args.nproc, "device": args.device, "quick": args.quick,
                     "modes": {}}
    with tempfile.TemporaryDirectory(prefix="vaswani-dist-") as tmp:
        for name in ["ddp", "fsdp"] if args.startup_only else MODES:  # the same start-up
            print(f"{name}: {args.nproc} processes ...", file=sys.stderr, flush=True)
            results["modes"][name] = run_mode(name, Path(tmp), args)
    mib = 2 ** 20
    results["parameters"] = results["modes"]["ddp"][0]["parameters"]
    ddp_startup = max(r["startup_peak_bytes"] for r in results["modes"]["ddp"])
    print(f"\n### Sharded vs data-parallel training: {results['parameters'] / 1e6:.1f}M "
          f"parameters, {args.nproc} processes on {args.device}\n")
    if args.startup_only:
        print("| mode | start-up peak per rank, MiB | vs ddp |\n|---|---|---|")
    else:
        ddp_state = max(r["state_bytes"]["total"] for r in results["modes"]["ddp"])
        cap = args.cap_mib * mib if args.cap_mib else 0.75 * ddp_state
        results["cap_mib"] = round(cap / mib, 1)
        print(f"A cap of {cap / mib:,.0f} MiB of training state per rank.\n\n"
              "| mode | params+grads+AdamW per rank, MiB | vs ddp | start-up peak per rank, "
              "MiB | vs ddp | peak per rank, MiB | step, s | fits the cap |\n"
              "|---|---|---|---|---|---|---|---|")
    for name, ranks in results["modes"].items():
        startup = max(r["startup_peak_bytes"] for r in ranks)
        summary = {"startup_peak_mib": [round(r["startup_peak_bytes"] / mib, 1) for r in ranks],
                   "startup_vs_ddp": round(startup / ddp_startup, 3)}
        results.setdefault("summary", {})[name] = summary
        started = (f"{' / '.join(f'{m:,.0f}' for m in summary['startup_peak_mib'])} | "
                   f"{summary['startup_vs_ddp']:.2f}x")
        if args.startup_only:
            print(f"| {name} | {started} |")
            continue
        state = max(r["state_bytes"]["total"] for r in ranks)
        summary.update(state_mib=round(state / mib, 1), vs_ddp=round(state / ddp_state, 3),
                       peak_mib=[round(r["peak_bytes"] / mib, 1) for r in ranks],
                       step_s=round(max(r["step_s"] for r in ranks), 3),
                       fits_cap=state <= cap)
        print(f"| {name} | {summary['state_mib']:,.1f} | {summary['vs_ddp']:.2f}x | {started} | "
              f"{' / '.join(f'{m:,.0f}' for m in summary['peak_mib'])} | "
              f"{summary['step_s']:.3f} | {'yes' if summary['fits_cap'] else 'no'} |")
    if args.json:
        Path(args.json).write_text(json.dumps({**results, "hardware": hardware()}, indent=2))
        print(f"\nwrote {args.json}")
    return results


if __name__ == "__main__":
    main()
