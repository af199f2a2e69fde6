"""Using a translation run (encoder-decoder): translate, score with sacreBLEU/chrF, and look
at its attention.

A source is encoded as ``tokens + <eos>`` (the layout the model trained on, tasks/translation.py)
and cut to ``max_len`` with a warning; the translation starts from ``<bos>`` and is capped at
``max_len_a * source_length + max_len_b`` tokens. ``beam == 1`` is greedy search. Every
translation runs on the run's inference engine (engine/): one sentence or thousands, each
decoded as it would be alone.
"""

from __future__ import annotations

import contextlib

import torch

from ..config import DecodeConfig
from ..engine import Request
from ..evaluation.metrics import bleu_chrf
from .base import Run, check_batch_size, encode_inputs
from .inside import as_batch, attention_map, next_token_probabilities, token_labels


class Translator(Run):
    takes_target = True
    decodes = True

    def translate(self, texts: list[str], *, beam: int | None = None, n_best: int = 1,
                  length_penalty: float | None = None, batch_size: int | None = None,
                  **controls) -> list[str] | list[list[tuple[str, float]]]:
        """Translate each text. ``beam=1`` is greedy. With ``n_best > 1``, each result is a
        list of (translation, score), best first. Empty texts give empty results.
        ``controls``: any ``[decode]`` option (``no_repeat_ngram_size``,
        ``repetition_penalty``, ``min_length``, ``max_len_a``, ...)."""
        decode = self.decode_options(beam=beam, n_best=n_best, length_penalty=length_penalty,
                                     **controls)
        results = self.translations(texts, decode, batch_size=batch_size)
        return results if n_best > 1 else [best[0][0] for best in results]

    def translations(self, texts: list[str], decode: DecodeConfig, *,
                     batch_size: int | None = None) -> list[list[tuple[str, float]]]:
        """The ``decode.n_best`` best (translation, score) of each text, best first; greedy
        when ``decode.beam == 1`` (score 0). An empty text gives ("", 0.0). At most
        ``batch_size`` texts are decoded together (the engine takes the next one in as one
        finishes); by default as many as the engine's rows hold (512 greedy, 128 with beam
        4: a small model's step costs a CPU about as much for many rows as for few, so more
        rows per step translate more sentences a second). Sources go in longest first
        (``Engine.run``'s ``longest_first``; docs/performance.md, "The engine's choices for a
        CPU"). A run loaded with ``workers`` splits the texts among them (workers.py)."""
        if batch_size is not None:
            check_batch_size(batch_size)
        if self.workers is not None and len(texts) > 1:
            return self.workers.map(self, "own_translations", texts, self.input_tokens(texts),
                                    decode, batch_size=batch_size)
        return self.own_translations(texts, decode, batch_size=batch_size)

    def own_translations(self, texts: list[str], decode: DecodeConfig, *,
                         batch_size: int | None = None) -> list[list[tuple[str, float]]]:
        """:meth:`translations` in this process, on its own engine."""
        requests = self.requests(texts, decode)
        rows = max([1, *(r.params.beam for r in requests.values())])  # a request's rows
        engine = self.engine_for(rows * min(len(requests), batch_size or len(requests)))
        limit = contextlib.nullcontext() if batch_size is None else \
            engine.rows(batch_size * rows)
        with limit:
            engine.run(list(requests.values()), longest_first=True)
        return self.results(texts, requests, decode)

    def input_tokens(self, texts: list[str]) -> list[int]:
        return [len(ids) + 1 for ids in self.source_tokenizer.encode_batch(texts)]  # <eos>

    def requests(self, texts: list[str], decode: DecodeConfig) -> dict[int, Request]:
        """An engine request for each non-empty text, by index."""
        todo = [i for i, t in enumerate(texts) if t.strip()]
        encoded = encode_inputs(self.source_tokenizer, [texts[i] for i in todo],
                                self.config.model.max_len, eos=True)
        return {i: self.request(ids, decode) for i, ids in zip(todo, encoded, strict=True)}

    def results(self, texts: list[str], requests: dict[int, Request], decode: DecodeConfig
                ) -> list[list[tuple[str, float]]]:
        """Each text's (translation, score) list once its request has finished (("", 0.0)
        for an empty text); a request's error is raised."""
        results = [[("", 0.0)] * decode.n_best for _ in texts]
        for i, request in requests.items():
            if request.error is not None:
                raise request.error
            results[i] = [(self.target_tokenizer.decode(h), score)
                          for h, score in request.hypotheses()]
        return results

    def request(self, source: list[int], decode: DecodeConfig) -> Request:
        """An engine request to translate ``source`` (ids, ``<eos>`` included): from
        ``<bos>``, at most ``max_len_a * len(source) + max_len_b`` tokens."""
        return Request.translation(source, self.params(decode, search=True),
                                   bos_id=self.target_tokenizer.bos_id,
                                   max_len_a=decode.max_len_a, max_len_b=decode.max_len_b)

    def score(self, pairs, *, beam=None, outputs=None):
        """sacreBLEU and chrF (with their signatures) of the translations of ``pairs``
        (source, reference)."""
        decode = self.config.decode if beam is None else self.config.decode.replace(beam=beam)
        best = self.translations([s for s, _ in pairs], decode.replace(n_best=1))
        hyps = [hyps[0][0] for hyps in best]
        if outputs is not None:
            outputs.extend(hyps)
        return {"sentences": len(pairs), "beam": decode.beam,
                **bleu_chrf(hyps, [t for _, t in pairs])}

    # --- looking inside ---------------------------------------------------------------------
    def explained_target(self, text, target):
        if target is None:  # the model's own greedy translation
            target = self.translate([text], beam=1)[0]
        return target

    def _pair(self, text: str, target: str) -> tuple[list[int], list[int]]:
        max_len = self.config.model.max_len
        return (encode_inputs(self.source_tokenizer, [text], max_len, eos=True)[0],
                encode_inputs(self.target_tokenizer, [target], max_len, bos=True)[0])

    @torch.no_grad()
    def attention(self, text, target=None):
        src_ids, tgt_ids = self._pair(text, self.explained_target(text, target))
        _, weights = self.model.forward_with_attention(as_batch(src_ids, self.device),
                                                       as_batch(tgt_ids, self.device))
        s = token_labels(self.source_tokenizer, src_ids)
        t = token_labels(self.target_tokenizer, tgt_ids)
        return {"encoder self-attention": attention_map(weights["encoder"][:, 0], s, s),
                "decoder self-attention": attention_map(weights["decoder"][:, 0], t, t),
                "cross-attention": attention_map(weights["cross"][:, 0], t, s)}

    @torch.no_grad()
    def output_probabilities(self, text, target=None):
        """Each target token's (and the final <eos>'s) probability under teacher forcing."""
        tok = self.target_tokenizer
        src_ids, tgt_ids = self._pair(text, self.explained_target(text, target))
        logits = self.model(as_batch(src_ids, self.device), as_batch(tgt_ids, self.device))
        return next_token_probabilities(logits, tgt_ids, token_labels(tok, tgt_ids),
                                        (tok.eos_id, tok.token(tok.eos_id)))
