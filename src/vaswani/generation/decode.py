"""Decoding a model: translate a source batch (greedy, beam search or sampling) or continue a
language-model prompt. These wrap the model-independent searches of search.py around a
model's stepper (steppers.py).

Output length for translation is capped per sentence at ``max_len_a * S_i + max_len_b``
tokens (S_i: that source's real length) and at the model's ``max_len``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..models import DecoderLM, EncoderDecoder
from .rules import Rules
from .search import NO_RULES, beam_search, decode_loop, sample_next
from .steppers import LMStepper, Seq2SeqStepper


def _limits(stepper: Seq2SeqStepper, max_len_a: float, max_len_b: int) -> Tensor:
    lengths = stepper.source_lengths().float()
    cap = stepper.model.config.max_len - 1  # the target input also holds <bos>
    return (lengths * max_len_a + max_len_b).long().clamp(min=1, max=cap)


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, *, bos_id: int, eos_id: int,
                  max_len_a: float = 1.5, max_len_b: int = 10, use_cache: bool = True,
                  rules: Rules = NO_RULES) -> list[list[int]]:
    """src (B, S) padded ids -> one list of output ids per sentence (without bos/eos)."""
    stepper = Seq2SeqStepper(model, src, use_cache=use_cache)
    start = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    return decode_loop(stepper, start, _limits(stepper, max_len_a, max_len_b),
                       lambda logits: logits.argmax(-1), eos_id=eos_id,
                       pad_id=model.config.pad_id, bos_id=bos_id, rules=rules,
                       history_start=1)


@torch.no_grad()
def beam_decode(model: EncoderDecoder, src: Tensor, *, beam: int, bos_id: int, eos_id: int,
                alpha: float = 0.6, n_best: int = 1, max_len_a: float = 1.5,
                max_len_b: int = 10, use_cache: bool = True, rules: Rules = NO_RULES
                ) -> list[list[tuple[list[int], float]]]:
    """Beam search: per sentence, the n_best (ids, GNMT-normalised score), best first."""
    stepper = Seq2SeqStepper(model, src, use_cache=use_cache)
    return beam_search(stepper, src.size(0), _limits(stepper, max_len_a, max_len_b), beam=beam,
                       bos_id=bos_id, eos_id=eos_id, pad_id=model.config.pad_id, alpha=alpha,
                       n_best=n_best, rules=rules)


@torch.no_grad()
def generate(model: DecoderLM, prompt: list[int], *, max_new_tokens: int, bos_id: int,
             eos_id: int | None = None, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | None = None, use_cache: bool = True,
             on_token=None, rules: Rules = NO_RULES) -> list[int]:
    """Continue ``prompt`` (token ids) by up to ``max_new_tokens`` tokens. ``temperature=0``
    is greedy. Stops early at ``eos_id`` if given. ``on_token(id)`` streams each new token;
    it may return True to end the output there (a stop string)."""
    device = next(model.parameters()).device
    tokens = torch.tensor([prompt or [bos_id]], dtype=torch.long, device=device)
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    stepper = LMStepper(model, use_cache=use_cache)
    stream = None if on_token is None else (
        lambda ids: torch.tensor([bool(on_token(int(ids[0])))], device=device))
    out = decode_loop(stepper, tokens, torch.tensor([max_new_tokens], device=device),
                      lambda logits: sample_next(logits, temperature=temperature, top_k=top_k,
                                                 top_p=top_p, generator=generator),
                      eos_id=-1 if eos_id is None else eos_id, pad_id=model.config.pad_id,
                      bos_id=bos_id, on_step=stream, rules=rules)
    return out[0]


@dataclass(frozen=True)
class Sampling:
    """How one row of a batched generation picks its tokens (as :func:`generate` would)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None


@torch.no_grad()
def generate_batch(model: DecoderLM, prompts: list[list[int]], *, max_new_tokens: list[int],
                   sampling: list[Sampling], bos_id: int, eos_id: int | None = None,
                   rules: Rules = NO_RULES, on_step=None) -> list[list[int]]:
    """Continue several prompts at once: left-padded into one batch, each row with its own
    length limit and sampling (and random generator), each as :func:`generate` would continue
    it alone. Prompt + new tokens must fit in ``max_len`` (no sliding window). ``on_step(ids)``
    sees each step's (N,) tokens and may return a (N,) bool tensor of rows to end."""
    device = next(model.parameters()).device
    pad = model.config.pad_id
    prompts = [p or [bos_id] for p in prompts]
    width = max(len(p) for p in prompts)
    tokens = torch.full((len(prompts), width), pad, dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        tokens[i, width - len(p):] = torch.tensor(p, device=device)
    pads = torch.tensor([width - len(p) for p in prompts], device=device)
    generators = [None if s.seed is None else torch.Generator(device).manual_seed(s.seed)
                  for s in sampling]

    def choose(logits: Tensor) -> Tensor:
        return torch.cat([sample_next(logits[i:i + 1], temperature=s.temperature, top_k=s.top_k,
                                      top_p=s.top_p, generator=g)
                          for i, (s, g) in enumerate(zip(sampling, generators, strict=True))])

    return decode_loop(LMStepper(model, pads=pads), tokens,
                       torch.tensor(max_new_tokens, device=device), choose,
                       eos_id=-1 if eos_id is None else eos_id, pad_id=pad, bos_id=bos_id,
                       on_step=on_step, rules=rules)
