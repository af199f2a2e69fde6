"""Decoding a model: translate a source batch (greedy, beam search or sampling) or continue a
language-model prompt. These wrap the model-independent searches of search.py around a
model's stepper (steppers.py).

Output length for translation is capped per sentence at ``max_len_a * S_i + max_len_b``
tokens (S_i: that source's real length) and at the model's ``max_len``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..models import DecoderLM, EncoderDecoder
from .search import beam_search, decode_loop, sample_next
from .steppers import LMStepper, Seq2SeqStepper


def _limits(stepper: Seq2SeqStepper, max_len_a: float, max_len_b: int) -> Tensor:
    lengths = stepper.source_lengths().float()
    cap = stepper.model.config.max_len - 1  # the target input also holds <bos>
    return (lengths * max_len_a + max_len_b).long().clamp(min=1, max=cap)


@torch.no_grad()
def greedy_decode(model: EncoderDecoder, src: Tensor, *, bos_id: int, eos_id: int,
                  max_len_a: float = 1.5, max_len_b: int = 10,
                  use_cache: bool = True) -> list[list[int]]:
    """src (B, S) padded ids -> one list of output ids per sentence (without bos/eos)."""
    stepper = Seq2SeqStepper(model, src, use_cache=use_cache)
    start = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    return decode_loop(stepper, start, _limits(stepper, max_len_a, max_len_b),
                       lambda logits: logits.argmax(-1), eos_id=eos_id,
                       pad_id=model.config.pad_id, bos_id=bos_id)


@torch.no_grad()
def beam_decode(model: EncoderDecoder, src: Tensor, *, beam: int, bos_id: int, eos_id: int,
                alpha: float = 0.6, n_best: int = 1, max_len_a: float = 1.5,
                max_len_b: int = 10, use_cache: bool = True
                ) -> list[list[tuple[list[int], float]]]:
    """Beam search: per sentence, the n_best (ids, GNMT-normalised score), best first."""
    stepper = Seq2SeqStepper(model, src, use_cache=use_cache)
    return beam_search(stepper, src.size(0), _limits(stepper, max_len_a, max_len_b), beam=beam,
                       bos_id=bos_id, eos_id=eos_id, pad_id=model.config.pad_id, alpha=alpha,
                       n_best=n_best)


@torch.no_grad()
def sample_decode(model: EncoderDecoder, src: Tensor, *, bos_id: int, eos_id: int,
                  temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
                  seed: int | None = None, max_len_a: float = 1.5,
                  max_len_b: int = 10) -> list[list[int]]:
    """Sample a translation per sentence (temperature / top-k / top-p, seedable)."""
    stepper = Seq2SeqStepper(model, src)
    generator = None if seed is None else torch.Generator(src.device).manual_seed(seed)
    start = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)
    return decode_loop(stepper, start, _limits(stepper, max_len_a, max_len_b),
                       lambda logits: sample_next(logits, temperature=temperature, top_k=top_k,
                                                  top_p=top_p, generator=generator),
                       eos_id=eos_id, pad_id=model.config.pad_id, bos_id=bos_id)


@torch.no_grad()
def generate(model: DecoderLM, prompt: list[int], *, max_new_tokens: int, bos_id: int,
             eos_id: int | None = None, temperature: float = 1.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | None = None, use_cache: bool = True,
             on_token=None) -> list[int]:
    """Continue ``prompt`` (token ids) by up to ``max_new_tokens`` tokens. ``temperature=0``
    is greedy. Stops early at ``eos_id`` if given. ``on_token(id)`` streams each new token."""
    device = next(model.parameters()).device
    tokens = torch.tensor([prompt or [bos_id]], dtype=torch.long, device=device)
    generator = None if seed is None else torch.Generator(device).manual_seed(seed)
    stepper = LMStepper(model, use_cache=use_cache)
    stream = None if on_token is None else (lambda ids: on_token(int(ids[0])))
    out = decode_loop(stepper, tokens, torch.tensor([max_new_tokens], device=device),
                      lambda logits: sample_next(logits, temperature=temperature, top_k=top_k,
                                                 top_p=top_p, generator=generator),
                      eos_id=-1 if eos_id is None else eos_id, pad_id=model.config.pad_id,
                      bos_id=bos_id, on_step=stream)
    return out[0]
