"""Using a translation run (encoder-decoder): translate, score with sacreBLEU/chrF, and look
at its attention.

A source is encoded as ``tokens + <eos>`` (the layout the model trained on, tasks/translation.py)
and cut to ``max_len`` with a warning; the translation starts from ``<bos>`` and is capped at
``max_len_a * source_length + max_len_b`` tokens. ``beam == 1`` is greedy search.
"""

from __future__ import annotations

import torch

from ..config import DecodeConfig
from ..data.batching import pad
from ..evaluation.metrics import bleu_chrf
from ..generation import Rules, beam_decode, greedy_decode
from .base import (
    Run,
    as_batch,
    attention_map,
    encode_inputs,
    next_token_probabilities,
    token_labels,
)


class Translator(Run):
    task_name = "translation"
    describes = "a translation model (encoder-decoder)"
    action = "translate"
    summary = "translation: type a sentence, get its translation"
    takes_target = True

    def translate(self, texts: list[str], *, beam: int | None = None, n_best: int = 1,
                  length_penalty: float | None = None, batch_size: int = 64, **controls
                  ) -> list[str] | list[list[tuple[str, float]]]:
        """Translate each text. ``beam=1`` is greedy. With ``n_best > 1``, each result is a
        list of (translation, score), best first. Empty texts give empty results.
        ``controls``: any ``[decode]`` option (``no_repeat_ngram_size``,
        ``repetition_penalty``, ``min_length``, ``max_len_a``, ...)."""
        decode = self.decode_options(beam=beam, n_best=n_best, length_penalty=length_penalty,
                                     **controls)
        results = self.translations(texts, decode, batch_size=batch_size)
        return results if n_best > 1 else [best[0][0] for best in results]

    @torch.no_grad()
    def translations(self, texts: list[str], decode: DecodeConfig, *, batch_size: int = 64
               ) -> list[list[tuple[str, float]]]:
        """The ``decode.n_best`` best (translation, score) of each text, best first; greedy
        when ``decode.beam == 1`` (score 0). An empty text gives ("", 0.0)."""
        source, target = self.source_tokenizer, self.target_tokenizer
        results = [[("", 0.0)] * decode.n_best for _ in texts]
        todo = [i for i, t in enumerate(texts) if t.strip()]
        encoded = encode_inputs(source, [texts[i] for i in todo], self.config.model.max_len,
                                eos=True)
        ids = dict(zip(todo, encoded, strict=True))
        order = sorted(todo, key=lambda i: len(ids[i]))  # similar lengths batch together
        common = dict(bos_id=target.bos_id, eos_id=target.eos_id, max_len_a=decode.max_len_a,
                      max_len_b=decode.max_len_b, rules=Rules.of(decode))
        for start in range(0, len(order), batch_size):
            chunk = order[start:start + batch_size]
            src = pad([ids[i] for i in chunk], self.config.model.pad_id).to(self.device)
            if decode.beam == 1 and decode.n_best == 1:
                outs = [[(o, 0.0)] for o in greedy_decode(self.model, src, **common)]
            else:
                outs = beam_decode(self.model, src, beam=decode.beam, n_best=decode.n_best,
                                   alpha=decode.length_penalty, **common)
            for i, hyps in zip(chunk, outs, strict=True):
                results[i] = [(target.decode(h), score) for h, score in hyps]
        return results

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
