"""Robustness outside the Bible: what a translator does with long modern sentences, under a few
decoding settings, next to what each setting costs on the held-out test books.

    python scripts/robustness.py RUN_DIR [--limit N] [--json FILE]

The modern sentences below were written for this script (news, legal, technical and everyday
prose; none from any test split). For each setting it reports, on them, the share of outputs
that repeat a 3-gram of words ("de la ley de la ley") and the mean output/input length ratio,
and, on the first N test verses (all by default), sacreBLEU. Beam 4 throughout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

MODERN = [
    "The central bank raised interest rates for the third time this year, citing persistent "
    "inflation in food and energy prices.",
    "Under the terms of this agreement, the tenant shall pay the rent on the first day of each "
    "month and shall not sublet the property without written consent.",
    "Researchers at the university published a study showing that regular exercise improves "
    "memory in older adults.",
    "The software update fixes a security vulnerability that allowed attackers to read "
    "private messages.",
    "After the storm, thousands of homes were left without electricity, and schools remained "
    "closed for several days.",
    "The committee will review all applications and notify the candidates of its decision "
    "before the end of the month.",
    "Please turn off your mobile phone before the meeting begins.",
    "The government announced new measures to reduce air pollution in the largest cities.",
    "Any dispute arising from this contract shall be resolved by arbitration in accordance "
    "with the rules of the chamber of commerce.",
    "The train to the airport leaves every fifteen minutes from the central station.",
    "Scientists warn that rising sea levels could threaten coastal communities within the "
    "next fifty years.",
    "The company reported record profits despite a decline in sales during the last quarter.",
]

SETTINGS = {
    "default": {},
    "no_repeat_ngram_size=3": {"no_repeat_ngram_size": 3},
    "no_repeat_ngram_size=4": {"no_repeat_ngram_size": 4},
    "repetition_penalty=1.2": {"repetition_penalty": 1.2},
}


def repeats_a_trigram(text: str) -> bool:
    words = text.split()
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(grams) != len(set(grams))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--limit", type=int, default=0, help="the first N test verses")
    parser.add_argument("--weights", default="best", choices=["best", "last", "averaged"])
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    import vaswani
    from vaswani.data.files import ReadReport, iter_translation
    from vaswani.data.registry import default_cache
    from vaswani.evaluation.metrics import bleu_chrf

    run = vaswani.load(args.run_dir, weights=args.weights)
    pairs = list(iter_translation(run.data_files("test", default_cache()), ReadReport()))
    if args.limit:
        pairs = pairs[:args.limit]
    results = {}
    print("| setting | modern: outputs repeating a 3-gram | modern: length ratio | test BLEU |\n"
          "|---|---|---|---|")
    for name, controls in SETTINGS.items():
        modern = run.translate(MODERN, beam=4, **controls)
        hyps = run.translate([s for s, _ in pairs], beam=4, **controls)
        bleu = bleu_chrf(hyps, [t for _, t in pairs])["bleu"]
        looped = sum(map(repeats_a_trigram, modern)) / len(MODERN)
        ratio = sum(len(o.split()) for o in modern) / sum(len(s.split()) for s in MODERN)
        results[name] = {"repeating": looped, "length_ratio": round(ratio, 3),
                         "test_bleu": round(bleu, 2), "outputs": modern}
        print(f"| {name} | {looped:.0%} | {ratio:.2f} | {bleu:.2f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"run_dir": args.run_dir, "weights": args.weights,
                                               "test_sentences": len(pairs),
                                               "settings": results}, indent=2,
                                              ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
