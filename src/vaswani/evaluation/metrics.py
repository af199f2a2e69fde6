"""Metrics on text: detokenized sacreBLEU and chrF (with their signatures), exact match,
perplexity from a mean negative log-likelihood."""

from __future__ import annotations

import math


def exact_match(hypotheses: list[str], references: list[str]) -> float:
    return sum(h == r for h, r in zip(hypotheses, references, strict=True)) / max(
        1, len(references))


def bleu_chrf(hypotheses: list[str], references: list[str]) -> dict:
    """Corpus sacreBLEU and chrF on detokenized text, with sacreBLEU's signatures."""
    import sacrebleu

    bleu = sacrebleu.metrics.BLEU()
    chrf = sacrebleu.metrics.CHRF()
    b = bleu.corpus_score(hypotheses, [references])
    c = chrf.corpus_score(hypotheses, [references])
    return {"bleu": b.score, "chrf": c.score, "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature())}


def perplexity(mean_nll: float) -> float:
    return math.exp(min(mean_nll, 50.0))
