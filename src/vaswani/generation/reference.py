"""The reference decoders, written out: greedy search, sampling and beam search over a model,
one batch of sentences (or one prompt) at a time, with a concatenating KV cache (or none).

The product decodes on the inference engine (engine/): continuous batching over a slot
cache, many requests at once. These are what it must equal: the engine's tests decode every
request here too, alone, and compare token for token (tests/engine). They stay as plain as
the searches are: a *stepper* gives a model's next-token logits for a growing batch
(``Seq2SeqStepper``, ``LMStepper``), ``decode_loop`` extends every row by one chosen token
until each has ended, ``beam_search`` runs a search.py ``Beam`` per sentence over K rows each.

All of them never produce ``<pad>`` or ``<bos>``, stop a sequence at its first ``<eos>``, and
stop it at its own length limit otherwise: for translation ``max_len_a * S_i + max_len_b``
tokens (S_i: that source's real length) and the model's ``max_len``. With ``use_cache=False``
a stepper recomputes the whole prefix every step (the slow reference the cache is tested
against).

Shape legend: N rows (sentences x beams), T tokens so far, S source length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..config.sections import check_beam
from ..models import DecoderLM, EncoderDecoder
from ..nn import masks
from .rules import Rules
from .sampling import sample_rows
from .search import Beam

NO_RULES = Rules()


# --- steppers: a model's next-token logits for a growing batch --------------------------------

def _last(new: Tensor) -> Tensor:
    """Each row's last new token (N,): whose next-token logits a step wants."""
    return torch.full((new.size(0),), new.size(1) - 1, device=new.device)


class Seq2SeqStepper:
    """The decoder of an EncoderDecoder, conditioned on an encoded source batch."""

    def __init__(self, model: EncoderDecoder, src: Tensor, *, use_cache: bool = True) -> None:
        self.model = model
        self.src_mask = src != model.config.pad_id  # (N, S)
        self.memory = model.encode(src, src_mask=self.src_mask)  # (N, S, D)
        self.cache = model.new_cache() if use_cache else None

    def source_lengths(self) -> Tensor:
        return self.src_mask.sum(1)  # (N,)

    def logits(self, tokens: Tensor) -> Tensor:
        """tokens (N, T), all tokens so far -> next-token logits (N, V)."""
        if self.cache is None:
            return self.model.decode(tokens, self.memory, src_mask=self.src_mask)[:, -1]
        new = tokens[:, self.cache.length:]  # only what the cache has not seen
        positions, mask = self.cache.inputs(new)
        return self.model.decode_step(new, positions=positions, mask=mask, cache=self.cache,
                                      memory=self.memory, last=_last(new),
                                      memory_mask=masks.key_padding_mask(self.src_mask))

    def reorder(self, rows: Tensor) -> None:
        """Keep rows ``rows`` (N_new,) of the batch, in that order."""
        self.memory = self.memory.index_select(0, rows)
        self.src_mask = self.src_mask.index_select(0, rows)
        if self.cache is not None:
            self.cache.reorder(rows)


class LMStepper:
    """A DecoderLM continuing its prompt(s). Past ``max_len`` tokens the context is cropped to
    the last half window (positions restart), as a model trained on windows expects."""

    def __init__(self, model: DecoderLM, *, use_cache: bool = True) -> None:
        self.model = model
        self.cache = model.new_cache() if use_cache else None
        self.offset = 0  # tokens cropped from the front of the context

    def logits(self, tokens: Tensor) -> Tensor:
        """tokens (N, T) -> next-token logits (N, V)."""
        max_len = self.model.config.max_len
        if tokens.size(1) - self.offset > max_len:  # slide the window
            self.offset = tokens.size(1) - max(1, max_len // 2)
            if self.cache is not None:
                self.cache = self.model.new_cache()
        context = tokens[:, self.offset:]
        if self.cache is None:
            return self.model(context, mask=torch.ones_like(context, dtype=torch.bool))[:, -1]
        new = context[:, self.cache.length:]
        positions, mask = self.cache.inputs(new)
        return self.model.decode_step(new, positions=positions, mask=mask, cache=self.cache,
                                      last=_last(new))

    def reorder(self, rows: Tensor) -> None:
        if self.cache is not None:
            self.cache.reorder(rows)


# --- the searches ------------------------------------------------------------------------------

def _blocked(logits: Tensor, blocked: tuple[int, ...]) -> Tensor:
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32), copy=True)
    logits[:, list(blocked)] = float("-inf")
    return logits


def _strip(rows: list[list[int]], eos_id: int, pad_id: int) -> list[list[int]]:
    out = []
    for row in rows:
        ids = []
        for i in row:
            if i in (eos_id, pad_id):
                break
            ids.append(i)
        out.append(ids)
    return out


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int = 0,
                top_p: float = 1.0, generator: torch.Generator | None = None) -> Tensor:
    """Pick one token per row from logits (N, V), every row with the same settings (see
    sampling.py): ``temperature == 0`` is argmax; ``top_k`` keeps the k likeliest tokens;
    ``top_p`` keeps the smallest set whose probability reaches p (the likeliest token always
    stays). One ``generator`` serves every row."""
    n, device = logits.size(0), logits.device
    return sample_rows(logits, torch.full((n,), float(temperature), device=device),
                       torch.full((n,), top_k, device=device),
                       torch.full((n,), float(top_p), device=device), [generator] * n)


@torch.inference_mode()
def decode_loop(stepper, tokens: Tensor, limits: Tensor, choose: Callable[[Tensor], Tensor], *,
                eos_id: int, pad_id: int, bos_id: int,
                on_step: Callable[[Tensor], Tensor | None] | None = None,
                rules: Rules = NO_RULES, history_start: int = 0) -> list[list[int]]:
    """Extend ``tokens`` (N, T0) one token at a time with ``choose(logits) -> (N,)`` until
    every row has produced ``<eos>`` or ``limits[i]`` new tokens. Returns the new tokens of
    each row (without ``<eos>``). ``on_step`` sees each step's chosen tokens (for streaming)
    and may return a (N,) bool tensor of rows to end now (a stop string, a client gone).
    ``rules`` (rules.py) see ``tokens[:, history_start:]`` as the sequence.
    """
    n_prefix = tokens.size(1)
    done = torch.zeros(tokens.size(0), dtype=torch.bool, device=tokens.device)
    for t in range(int(limits.max()) if limits.numel() else 0):
        logits = _blocked(stepper.logits(tokens), (pad_id, bos_id))
        logits = rules.apply(logits, tokens[:, history_start:], tokens[:, n_prefix:],
                             eos_id=eos_id, pad_id=pad_id)
        next_id = choose(logits).masked_fill(done, pad_id)
        tokens = torch.cat([tokens, next_id[:, None]], dim=1)
        ended = on_step(next_id) if on_step is not None else None
        done |= (next_id == eos_id) | (t + 1 >= limits)
        if ended is not None:
            done |= ended
        if bool(done.all()):
            break
    return _strip(tokens[:, n_prefix:].tolist(), eos_id, pad_id)


@torch.inference_mode()
def beam_search(stepper, n_sentences: int, limits: Tensor, *, beam: int, bos_id: int,
                eos_id: int, pad_id: int, alpha: float = 0.0, n_best: int = 1,
                rules: Rules = NO_RULES) -> list[list[tuple[list[int], float]]]:
    """Beam search over ``n_sentences`` at once, each sentence a :class:`Beam` over K rows of
    the batch (dead rows, with score -inf, keep it rectangular); returns, per sentence, the
    ``n_best`` best finished hypotheses as (token ids without <eos>, normalised score), best
    first. Sentences never affect one another, so the output does not depend on what else is
    in the batch. ``rules`` (rules.py) adjust the log-probabilities; they keep them <= 0 (so
    a Beam's bound holds) unless a presence or frequency penalty is negative, and then a
    sentence runs to its limit.
    """
    check_beam(beam, n_best, alpha)
    B, K = n_sentences, beam
    device = limits.device
    bounded = rules.presence_penalty >= 0 and rules.frequency_penalty >= 0
    beams = [Beam(K, int(limits[b]), eos_id=eos_id, alpha=alpha, bounded=bounded,
                  n_best=n_best) for b in range(B)]
    stepper.reorder(torch.arange(B, device=device).repeat_interleave(K))  # (B*K) rows
    tokens = torch.full((B * K, 1), bos_id, dtype=torch.long, device=device)
    scores = torch.full((B, K), float("-inf"), dtype=torch.float64, device=device)
    scores[:, 0] = 0.0  # one live hypothesis per sentence at the start
    for t in range(int(limits.max())):
        logp = _blocked(stepper.logits(tokens), (pad_id, bos_id)).log_softmax(-1)  # (B*K, V)
        logp = rules.apply(logp, tokens[:, 1:], tokens[:, 1:], eos_id=eos_id, pad_id=pad_id)
        logp = logp.view(B, K, -1)
        histories = tokens[:, 1:].tolist()
        rows, next_tokens, next_scores = [], [], []
        for b, sentence in enumerate(beams):
            alive = [] if sentence.done else sentence.step(
                t + 1, scores[b], logp[b], histories[b * K:(b + 1) * K])
            alive += [(0, pad_id, float("-inf"))] * (K - len(alive))  # dead rows
            for row, token, s in alive:
                rows.append(b * K + row)
                next_tokens.append(token)
                next_scores.append(s)
        if all(sentence.done for sentence in beams):
            break
        row_index = torch.tensor(rows, device=device)
        stepper.reorder(row_index)
        tokens = torch.cat([tokens.index_select(0, row_index),
                            torch.tensor(next_tokens, device=device)[:, None]], dim=1)
        scores = torch.tensor(next_scores, dtype=torch.float64, device=device).view(B, K)
    return [sentence.best(n_best) for sentence in beams]


# --- the decoders --------------------------------------------------------------------------------

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
