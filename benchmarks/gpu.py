"""vaswani on a GPU, side by side with the alternatives, in one process.

    python -m benchmarks.gpu [--quick] [--device cuda] [--only loss seq2seq lm decode]
                             [--compile [--compile-backend B]] [--batch-tokens N]
                             [--json OUT.json]

* **loss**: the task's label-smoothed cross-entropy (``models/losses.py``, forward and
  backward), eager (off the CPU, a log-softmax and its backward) and compiled (a compiled
  step's), against ``F.cross_entropy(label_smoothing=0.1)`` on 16,384 x 32,000 bf16 logits,
  as given and under autocast.
* **seq2seq**: Transformer-base (d 512, 6+6 layers, 8 heads, d_ff 2048) and -big (d 1024, 16
  heads, d_ff 4096), shared 32k vocabulary, batches of 128-token sequences holding
  ``--batch-tokens`` tokens (default 25,600, as the paper's ~25,000; before, 16,384), bf16
  autocast, fused AdamW: vaswani through its task's loss against ``torch.nn.Transformer`` given
  its best loss (``F.cross_entropy`` with label smoothing); with ``--compile`` each also
  compiled (vaswani's loss then the compiled one, as a compiled training step's).
* **lm**: a GPT-2-small-shaped decoder (d 768, 12 layers, 12 heads, vocabulary 50,257,
  16 x 1024 tokens) through the task loss, against Hugging Face's GPT-2 (when
  ``transformers`` is installed); with ``--compile`` each eager and compiled.
* **decode**: the same LM, random weights, through the engine (slot KV cache, CUDA graphs):
  batch-1 and batch-32 greedy tokens/s, against Hugging Face ``generate`` (static cache off).

MFU = the step's FLOPs (``torch.utils.flop_counter.FlopCounterMode`` on forward + backward)
/ step time / the peak of a large bf16 matmul measured in the same process. The FLOPs are
counted after the timing, under ``torch.compiler.set_stance("force_eager")``: torch.compile
skips a frame that runs under a dispatch mode such as the counter and remembers the skip, so
counted first, a compiled model would have run eager in every timed step. Each contender's
warm-up records the graphs dynamo compiled for it (``compiled_graphs`` in the JSON); a
compiled row that compiled none is flagged. Steps are timed after warm-up with the device
synchronised; the contenders alternate. ``--quick`` shrinks
every shape (a smoke run, also on a CPU: ``--quick --device cpu``); its numbers mean nothing.
On a device without native bf16 (an AVX2 CPU) everything runs in fp32 and says so.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.utils.flop_counter import FlopCounterMode

from vaswani import ModelConfig, build_model
from vaswani.config import TrainConfig
from vaswani.devices import bf16_is_fast
from vaswani.models.losses import (
    compiled_smoothed_cross_entropy,
    reference_smoothed_cross_entropy,
    smoothed_cross_entropy,
)
from vaswani.training.optimizers import make_optimizer

from .baselines import TorchTransformer
from .common import report
from .gpu_decode import decode_rows, gpt2_model


@dataclass(frozen=True)
class Shape:
    d: int
    heads: int
    d_ff: int
    layers: int
    vocab: int
    batch: int
    length: int


FULL = {"base": Shape(512, 8, 2048, 6, 32_000, 128, 128),
        "big": Shape(1024, 16, 4096, 6, 32_000, 128, 128),
        "gpt2": Shape(768, 12, 3072, 12, 50_257, 16, 1024),
        "loss": Shape(0, 0, 0, 0, 32_000, 16_384, 1)}
QUICK = {"base": Shape(64, 4, 128, 2, 1000, 8, 32),
         "big": Shape(128, 4, 256, 2, 1000, 8, 32),
         "gpt2": Shape(64, 4, 128, 2, 1000, 4, 64),
         "loss": Shape(0, 0, 0, 0, 1000, 2048, 1)}


class Bench:
    def __init__(self, device: torch.device, quick: bool, repeats: int = 20,
                 batch_tokens: int = 25_600, backend: str = "inductor") -> None:
        self.device, self.quick, self.backend = device, quick, backend
        self.graphs: dict[str, int] = {}  # contender -> graphs dynamo compiled in its warm-up
        self.shapes = dict(QUICK if quick else FULL)
        if not quick:  # the seq2seq rows' batches: that many tokens of 128-token sequences
            for name in ("base", "big"):
                s = self.shapes[name]
                self.shapes[name] = Shape(s.d, s.heads, s.d_ff, s.layers, s.vocab,
                                          max(1, batch_tokens // s.length), s.length)
        self.bf16 = bf16_is_fast(device)
        self.dtype = torch.bfloat16 if self.bf16 else torch.float32
        self.warmup, self.timed = (1, 2) if quick else (min(5, repeats), repeats)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def times(self, fns: dict) -> dict[str, float]:
        """Median seconds per call of each function, the functions alternating; the graphs
        dynamo compiled in each one's warm-up go to ``self.graphs``."""
        for name, fn in fns.items():
            before = counters["stats"]["unique_graphs"]
            for _ in range(self.warmup):
                fn()
            self.graphs[name] = counters["stats"]["unique_graphs"] - before
        self.sync()
        seen: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(self.timed):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                self.sync()
                seen[name].append(time.perf_counter() - start)
        return {k: statistics.median(v) for k, v in seen.items()}

    @functools.cache  # noqa: B019 (one Bench per process)
    def peak_tflops(self) -> float:
        """A large square matmul's TFLOP/s in the benchmark's dtype (measured once)."""
        n = 1024 if self.quick else 8192
        a = torch.randn(n, n, device=self.device, dtype=self.dtype)
        b = torch.randn(n, n, device=self.device, dtype=self.dtype)
        t = self.times({"mm": lambda: a @ b})["mm"]
        return 2 * n ** 3 / t / 1e12

    def flops(self, step) -> float:
        """The FLOPs of one forward and backward of ``step``, run eagerly: call it after the
        timing (see the module's docstring)."""
        with torch.compiler.set_stance("force_eager"), FlopCounterMode(display=False) as c:
            step(count_only=True)
        return float(c.get_total_flops())

    def compiled(self, model):
        return torch.compile(model, backend=self.backend)

    def check_compiled(self, names) -> dict[str, int]:
        """The graphs of the compiled contenders ``names``; a loud line for one with none."""
        graphs = {name: self.graphs.get(name, 0) for name in names}
        for name, n in graphs.items():
            if n == 0:
                print(f"WARNING: {name} compiled no graph: its row measured eager code",
                      flush=True)
        return graphs

    def rand(self, vocab: int, *shape: int) -> torch.Tensor:
        return torch.randint(4, vocab, shape, device=self.device)


# --- the loss ----------------------------------------------------------------------------------

def loss_rows(b: Bench) -> tuple[list, dict]:
    """The task's loss, eager (off the CPU: a log-softmax and PyTorch's log-softmax backward)
    and compiled (a compiled step's: inductor fuses the reference into a pass or two over
    the logits), against ``F.cross_entropy`` on the bf16 logits as given and under bf16
    autocast (which upcasts them: how a training step that computes its loss inside autocast
    calls it)."""
    s = b.shapes["loss"]
    logits = torch.randn(s.batch, s.vocab, device=b.device, dtype=b.dtype, requires_grad=True)
    target = b.rand(s.vocab, s.batch)
    target[::9] = 0  # padding

    def run(loss_fn):
        def call():
            loss_fn().backward()
            logits.grad = None
        return call

    contenders = {
        "vaswani": run(lambda: smoothed_cross_entropy(logits, target, smoothing=0.1,
                                                      pad_id=0)[0]),
        "vaswani compiled": run(lambda: compiled_smoothed_cross_entropy(
            logits, target, smoothing=0.1, pad_id=0)[0]),
        "F.cross_entropy": run(lambda: F.cross_entropy(logits, target, label_smoothing=0.1,
                                                       ignore_index=0, reduction="sum")),
    }

    def under_autocast():
        with b.autocast():
            return F.cross_entropy(logits, target, label_smoothing=0.1, ignore_index=0,
                                   reduction="sum")
    contenders["F.cross_entropy under autocast"] = run(under_autocast)
    t = b.times(contenders)
    base = t["F.cross_entropy"]
    shape = f"loss {s.batch:,} x {s.vocab:,} ({b.dtype}), fwd+bwd"
    rows = [(f"{shape}: {name}", f"{t[name] * 1e3:.2f} ms, {t[name] / base:.2f}x "
             "F.cross_entropy's time") for name in contenders]
    return rows, {"loss_ms": t["vaswani"] * 1e3, "compiled_loss_ms": t["vaswani compiled"] * 1e3,
                  "cross_entropy_ms": base * 1e3,
                  "cross_entropy_autocast_ms": t["F.cross_entropy under autocast"] * 1e3,
                  "loss_over_cross_entropy": t["vaswani"] / base,
                  "compiled_loss_over_cross_entropy": t["vaswani compiled"] / base}


# --- training steps ----------------------------------------------------------------------------

def criterion_for(b: Bench, compile_it: bool):
    """The loss a training step uses: the compiled one when the step is compiled, as the
    tasks pick it (tasks/base.py ``Task.criterion``; with another ``--compile-backend``, the
    same reference compiled by it)."""
    if not compile_it:
        return smoothed_cross_entropy
    if b.backend == "inductor":
        return compiled_smoothed_cross_entropy
    return torch.compile(reference_smoothed_cross_entropy, dynamic=True, backend=b.backend)


def train_step(b: Bench, model, loss_fn, compile_it: bool):
    model.to(b.device).train()
    opt = make_optimizer(model, TrainConfig(lr=1e-4))
    run = b.compiled(model) if compile_it else model

    def step(count_only: bool = False):
        with b.autocast():
            loss = loss_fn(run)
        loss.backward()
        if count_only:
            model.zero_grad(set_to_none=True)
            return
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def seq2seq_rows(b: Bench, compile_it: bool) -> tuple[list, dict]:
    rows, out = [], {}
    for name in ("base", "big"):
        more_rows, more = seq2seq_one(b, name, compile_it)
        rows += more_rows
        out.update(more)
        if b.device.type == "cuda":
            torch.cuda.empty_cache()
    return rows, out


def seq2seq_one(b: Bench, name: str, compile_it: bool) -> tuple[list, dict]:
    rows, out = [], {}
    s = b.shapes[name]
    src, tgt = b.rand(s.vocab, s.batch, s.length), b.rand(s.vocab, s.batch, s.length + 1)
    torch.manual_seed(0)
    ours = build_model(ModelConfig(arch="encoder-decoder", d_model=s.d, n_heads=s.heads,
                                   d_ff=s.d_ff, n_layers=s.layers, vocab_size=s.vocab,
                                   dropout=0.1, norm_first=True, share_embeddings=True,
                                   tie_embeddings=True, max_len=512),
                       fast=b.device.type == "cpu")
    theirs = TorchTransformer(s.vocab, s.d, s.heads, s.d_ff, s.layers, 0.1)

    def our_loss(criterion):  # the translation task's loss path
        def loss(m):
            logits = m(src, tgt[:, :-1])
            total, _, n = criterion(logits.flatten(0, 1), tgt[:, 1:].flatten(), smoothing=0.1,
                                    pad_id=0)
            return total / n
        return loss

    def their_loss(m):
        logits = m(src, tgt[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), tgt[:, 1:].flatten(),
                               label_smoothing=0.1, ignore_index=0)

    steps = {"vaswani": train_step(b, ours, our_loss(criterion_for(b, False)), False),
             "torch.nn.Transformer": train_step(b, theirs, their_loss, False)}
    if compile_it:  # every contender both ways
        steps["vaswani compiled"] = train_step(b, ours, our_loss(criterion_for(b, True)), True)
        steps["torch.nn.Transformer compiled"] = train_step(b, theirs, their_loss, True)
    t = b.times(steps)
    flops = b.flops(steps["vaswani"])  # after the timing, eagerly: see the docstring
    tokens = s.batch * s.length
    peak = b.peak_tflops()
    for who, seconds in t.items():
        mfu = flops / seconds / 1e12 / peak
        rows.append((f"seq2seq {name}: {who}", f"{tokens / seconds:,.0f} tok/s, "
                     f"MFU {mfu:.1%}"))
        out[f"seq2seq_{name}_{who}_tok_s"] = tokens / seconds
        out[f"seq2seq_{name}_{who}_mfu"] = mfu
    for mode in ("", " compiled") if compile_it else ("",):
        ratio = t[f"torch.nn.Transformer{mode}"] / t[f"vaswani{mode}"]
        rows.append((f"seq2seq {name}: vaswani{mode} / torch.nn.Transformer{mode}",
                     f"{ratio:.2f}x"))
        out[f"seq2seq_{name}{mode.replace(' ', '_')}_vs_torch"] = ratio
    if compile_it:
        out[f"seq2seq_{name}_compiled_graphs"] = b.check_compiled(
            ["vaswani compiled", "torch.nn.Transformer compiled"])
    return rows, out


def lm_rows(b: Bench, compile_it: bool) -> tuple[list, dict]:
    s = b.shapes["gpt2"]
    ids = b.rand(s.vocab, s.batch, s.length + 1)
    torch.manual_seed(0)

    def our_loss(criterion):  # the language-model task's loss path
        def loss(m):
            logits = m(ids[:, :-1])
            total, _, n = criterion(logits.flatten(0, 1), ids[:, 1:].flatten())
            return total / n
        return loss

    ours = gpt2_model(s, b.device)
    steps = {"vaswani": train_step(b, ours, our_loss(criterion_for(b, False)), False)}
    if compile_it:
        steps["vaswani compiled"] = train_step(b, ours, our_loss(criterion_for(b, True)), True)
    try:
        import transformers

        hf_cfg = transformers.GPT2Config(vocab_size=s.vocab, n_positions=max(s.length, 1024),
                                         n_embd=s.d, n_layer=s.layers, n_head=s.heads,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)

        def hf_loss(m):
            logits = m(ids[:, :-1]).logits
            return F.cross_entropy(logits.flatten(0, 1).float(), ids[:, 1:].flatten())

        hf = transformers.GPT2LMHeadModel(hf_cfg)
        steps["HF GPT-2 eager"] = train_step(b, hf, hf_loss, False)
        if compile_it:
            steps["HF GPT-2 compiled"] = train_step(b, hf, hf_loss, True)
    except ImportError:
        print("transformers is not installed: no Hugging Face rows", flush=True)
    t = b.times(steps)
    flops = b.flops(steps["vaswani"])  # after the timing, eagerly: see the docstring
    tokens, peak = s.batch * s.length, b.peak_tflops()
    rows, out = [], {}
    for who, seconds in t.items():
        mfu = flops / seconds / 1e12 / peak
        rows.append((f"GPT-2-small LM: {who}", f"{tokens / seconds:,.0f} tok/s, MFU {mfu:.1%}"))
        out[f"lm_{who}_tok_s"], out[f"lm_{who}_mfu"] = tokens / seconds, mfu
    if compile_it:
        out["lm_compiled_graphs"] = b.check_compiled([k for k in steps if "compiled" in k])
    return rows, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true",
                        help="tiny shapes: a smoke run whose numbers mean nothing")
    parser.add_argument("--only", nargs="+", default=["loss", "seq2seq", "lm", "decode"],
                        choices=["loss", "seq2seq", "lm", "decode"])
    parser.add_argument("--compile", action="store_true",
                        help="also torch.compile each model (rows eager and compiled)")
    parser.add_argument("--compile-backend", default="inductor", metavar="B",
                        help="torch.compile's backend for --compile (default inductor; "
                             "'eager' checks the compiled rows' plumbing in seconds)")
    parser.add_argument("--batch-tokens", type=int, default=25_600, metavar="N",
                        help="seq2seq: tokens per batch (default 25,600: 200 x 128, as the "
                             "paper's ~25,000)")
    parser.add_argument("--repeats", type=int, default=20, metavar="N",
                        help="timed calls of each contender (median; default 20), after "
                             "min(5, N) warm-up calls")
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON")
    args = parser.parse_args()
    b = Bench(torch.device(args.device), args.quick, args.repeats, args.batch_tokens,
              args.compile_backend)
    if not b.bf16:
        print(f"{args.device}: no native bf16 here; every row runs in fp32", flush=True)
    rows: list = []
    results: dict = {"device": args.device, "dtype": str(b.dtype), "quick": args.quick,
                     "compile": args.compile, "repeats": b.timed, "peak_tflops": b.peak_tflops(),
                     "batch_tokens": args.batch_tokens}
    rows.append(("matmul peak", f"{results['peak_tflops']:.1f} TFLOP/s ({b.dtype})"))
    parts = {"loss": lambda: loss_rows(b), "seq2seq": lambda: seq2seq_rows(b, args.compile),
             "lm": lambda: lm_rows(b, args.compile), "decode": lambda: decode_rows(b)}
    for name in args.only:
        more_rows, more = parts[name]()
        rows += more_rows
        results.update(more)
        for row in more_rows:
            print(f"{row[0]}: {row[1]}", flush=True)
        if b.device.type == "cuda":
            torch.cuda.empty_cache()
    report(f"vaswani on {args.device} (higher is better)", rows, results, args.json)


if __name__ == "__main__":
    main()
