"""Train a small encoder-decoder to copy strings, in one readable file.

The copy task is the "hello world" of sequence-to-sequence models: the source is a random
string of the letters a-j (length 5-20) and the target is the same string. A model that gets
it right has learned to attend from each output position to the matching input position.

    python examples/copy_task.py            # trains for about a minute, then shows it copying

Everything here uses the public API: ModelConfig, build_model, the model's forward pass,
and ``vaswani.generation.greedy_decode`` to read the answers back. The full training loop
(schedules, checkpoints, resume, DDP) lives in ``vaswani train``; this file is the minimal
version a learner can read top to bottom.
"""

from __future__ import annotations

import argparse
import random
import time

import torch
import torch.nn.functional as F

from vaswani import ModelConfig, build_model
from vaswani.generation import greedy_decode

PAD, BOS, EOS = 0, 1, 2
LETTERS = "abcdefghij"
VOCAB = {c: i + 3 for i, c in enumerate(LETTERS)}  # ids 3..12
ITOS = {i: c for c, i in VOCAB.items()}


def random_strings(rng: random.Random, n: int, min_len: int = 5, max_len: int = 20) -> list[str]:
    return ["".join(rng.choice(LETTERS) for _ in range(rng.randint(min_len, max_len)))
            for _ in range(n)]


def encode_batch(strings: list[str], bos: bool = False, eos: bool = False) -> torch.Tensor:
    """Strings -> right-padded (B, L) ids."""
    rows = [([BOS] if bos else []) + [VOCAB[c] for c in s] + ([EOS] if eos else [])
            for s in strings]
    width = max(len(r) for r in rows)
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


def greedy_copy(model, strings: list[str]) -> list[str]:
    """Decode greedily (one token at a time, with the library's KV-cached decoder)."""
    outputs = greedy_decode(model, encode_batch(strings, eos=True), bos_id=BOS, eos_id=EOS,
                            max_len_a=1.0, max_len_b=2)
    return ["".join(ITOS.get(i, "?") for i in ids) for ids in outputs]


def exact_match(model, strings: list[str]) -> float:
    pairs = zip(greedy_copy(model, strings), strings, strict=True)
    return sum(p == s for p, s in pairs) / len(strings)


def train(steps: int = 1200, batch_size: int = 64, seed: int = 0, log_every: int = 100,
          verbose: bool = True):
    """Train on fresh random strings every step; return (model, seconds)."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    config = ModelConfig(arch="encoder-decoder", vocab_size=3 + len(LETTERS), d_model=64,
                         n_heads=4, d_ff=256, n_layers=2, dropout=0.0, max_len=32,
                         norm_first=True, pad_id=PAD)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.98),
                                  weight_decay=0.0)
    warmup = 100  # linear warmup, then linear decay to zero: the last steps polish the copy

    def lr_factor(s: int) -> float:
        return min((s + 1) / warmup, (steps - s) / (steps - warmup))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    start = time.perf_counter()
    for step in range(1, steps + 1):
        strings = random_strings(rng, batch_size)
        src = encode_batch(strings, eos=True)
        tgt = encode_batch(strings, bos=True, eos=True)
        logits = model(src, tgt[:, :-1])  # teacher forcing: predict tgt[:, 1:]
        loss = F.cross_entropy(logits.flatten(0, 1), tgt[:, 1:].flatten(), ignore_index=PAD)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if verbose and step % log_every == 0:
            print(f"step {step:5d}  loss {loss.item():.4f}  "
                  f"{time.perf_counter() - start:5.1f}s", flush=True)
    return model.eval(), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1200, help="optimizer steps (default 1200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    model, seconds = train(steps=args.steps, seed=args.seed)
    fresh = random_strings(random.Random(args.seed + 1), 1000)
    print(f"\ntrained in {seconds:.0f}s; exact match on 1000 fresh strings: "
          f"{exact_match(model, fresh):.1%}\n")
    for source, copy in zip(fresh[:5], greedy_copy(model, fresh[:5]), strict=True):
        print(f"  {source:<22} -> {copy:<22} {'ok' if source == copy else 'WRONG'}")


if __name__ == "__main__":
    main()
