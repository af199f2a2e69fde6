"""Choosing the next token of the engine's rows: each row's scores from its logits, changed
as its reference decoder (generation/) changes them (``<pad>`` and ``<bos>`` never chosen,
only the tokens its request's grammar allows (generation/grammar.py), its request's
decoding rules applied to the history that decoder gives them), then its token
from those scores: greedy, or sampled with its request's settings and its own generator
(generation/sampling.py ``sample_rows``). Beam searches rank the log-probabilities these
scores give (beam.py).

Shapes: N rows of logits, V vocabulary.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..generation.rules import Rules
from ..generation.sampling import first_max, sample_rows
from .request import Request, Sequence
from .tensors import tensor_of

Row = tuple[Request, Sequence]


def rows_of(logits: Tensor, index: list[int]) -> Tensor:
    """``logits[index]``: the tensor itself (not a copy) when that is all of it, in order,
    which the caller may then change in place."""
    if index == list(range(logits.size(0))):
        return logits
    return logits.index_select(0, tensor_of(index, logits.device))


def log_probabilities(rows: list[Row], logits: Tensor) -> dict:
    """For each row whose request keeps log-probabilities (``Params.logprobs``): a function
    of the chosen token giving (its log-probability, the most likely tokens'), from the
    model's own logits (N, V) of these rows, before any decoding setting changes them."""
    wanted = [k for k, (r, _) in enumerate(rows) if r.params.logprobs is not None]
    if not wanted:
        return {}
    log_p = logits[wanted].float().log_softmax(-1)  # (W, V): a copy

    def entry(w: int, k: int):
        n = rows[k][0].params.logprobs
        alternatives = likeliest(log_p[w], n) if n else []
        return lambda token: (float(log_p[w, token]), alternatives)
    return {k: entry(w, k) for w, k in enumerate(wanted)}


def likeliest(log_p: Tensor, n: int) -> list[tuple[int, float]]:
    """The ``n`` likeliest tokens of ``log_p`` (V,) and their values, the likeliest first and
    equal values in the order of their tokens (``topk``'s order among equals depends on the
    shape it runs over, and bfloat16-rounded logits tie often)."""
    floor = log_p.topk(n).values[-1]
    tokens = (log_p >= floor).nonzero()[:, 0]  # in token order: the n, and any tied with them
    values, order = log_p[tokens].sort(descending=True, stable=True)
    return list(zip(tokens[order[:n]].tolist(), values[:n].tolist(), strict=True))


class Sampler:
    def __init__(self, *, pad_id: int, bos_id: int, eos_id: int, device: torch.device) -> None:
        self.pad_id, self.bos_id, self.eos_id, self.device = pad_id, bos_id, eos_id, device

    def choose(self, rows: list[Row], logits: Tensor) -> Tensor:
        """The next token (N,) of each of ``rows``, whose logits are ``logits`` (N, V)
        (changed in place). A request that keeps log-probabilities (``Params.logprobs``) gets
        its token's, from the logits as the model gave them."""
        params = [r.params for r, _ in rows]
        kept = log_probabilities(rows, logits)  # before the scores change them
        scores = self.scores(rows, logits, log=False)
        if all(p.temperature == 0 or p.top_k == 1 for p in params):  # all greedy, as
            tokens = first_max(scores)  # sample_rows would find, without its settings' tensors
        else:
            tokens = sample_rows(scores, tensor_of([p.temperature for p in params], self.device,
                                                   torch.float32),
                                 tensor_of([p.top_k for p in params], self.device),
                                 tensor_of([p.top_p for p in params], self.device,
                                           torch.float32),
                                 [r.generator for r, _ in rows])
        for k, entry in kept.items():
            rows[k][0].logprobs.append(entry(int(tokens[k])))
        for (request, _), token in zip(rows, tokens.tolist(), strict=True):
            if request.constraint is not None:  # its grammar follows the chosen token
                request.constraint.consume(token)
        return tokens

    def scores(self, rows: list[Row], logits: Tensor, log: bool,
               at: list[int] | None = None) -> Tensor:
        """Next-token scores from ``logits`` (N, V), changed in place (the caller's own
        tensor): <pad> and <bos> never chosen, each of ``rows`` (its logits ``logits[at[i]]``;
        without ``at``, row i's are ``logits[i]``) with its request's rules applied with the
        history its reference decoder gives them; log-probabilities with ``log``."""
        scores = logits.to(torch.promote_types(logits.dtype, torch.float32))
        for never in (self.pad_id, self.bos_id):  # a column each: indexing by a list of
            scores[:, never] = float("-inf")  # them would be a scatter, slower
        held = [i for i, (request, _) in enumerate(rows) if request.constraint is not None]
        if held:  # a grammar's rows: only the tokens it allows (generation/grammar.py)
            where = held if at is None else [at[i] for i in held]
            allowed = torch.stack([rows[i][0].constraint.allowed(scores.shape[-1])
                                   for i in held]).to(self.device)
            scores[where] = scores[where].masked_fill(~allowed, float("-inf"))
        if log:  # in place: the same bits as a new tensor, without writing one
            scores = torch.log_softmax(scores, -1, out=scores)
        groups: dict[Rules, list[int]] = {}
        for i, (request, _) in enumerate(rows):
            if request.params.rules.active:
                groups.setdefault(request.params.rules, []).append(i)
        for rules, index in groups.items():  # only the histories the rules read
            these = [rows[i] for i in index]
            histories = outputs = None
            if rules.reads_sequence:
                histories = self._pad([s.tokens[r.history_start:] for r, s in these])
            if rules.reads_generated:
                outputs = self._pad([s.tokens[len(r.start):] for r, s in these])
            lengths = None  # min_length reads how many tokens each row has made
            if rules.min_length:
                lengths = torch.tensor([len(s.tokens) - len(r.start) for r, s in these],
                                       device=self.device)
            where = index if at is None else [at[i] for i in index]
            scores[where] = rules.apply(scores[where], histories, outputs, eos_id=self.eos_id,
                                        pad_id=self.pad_id, lengths=lengths)
        return scores

    def _pad(self, rows: list[list[int]]) -> Tensor:
        width = max(1, max(len(r) for r in rows))
        return torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows],
                            dtype=torch.long, device=self.device)
