"""Robustness outside the Bible: what a translator does with modern sentences, under a few
decoding settings, next to what each setting costs on the held-out test books.

    python scripts/robustness.py RUN_DIR [--limit N] [--beam K] [--json FILE]

The modern set, ``scripts/data/modern-en-es.tsv``: 79 English sentences of news, legal,
technical, medical, travel and everyday prose, each with a Spanish reference translation,
written for this project (none from any corpus or test split; public domain, CC0). For each
setting it reports, on them: sacreBLEU and chrF against the references, the share of outputs
that repeat a 3-gram of words ("de la ley de la ley"), the share that ran to the length cap
(a loop the cap cut off), and the output/reference length ratio in words; and, on the first
N test verses (all by default), sacreBLEU. Beam 4 unless ``--beam`` says otherwise; every
other decoding option is the run's ``[decode]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MODERN = Path(__file__).resolve().parent / "data" / "modern-en-es.tsv"

SETTINGS = {
    "default": {},
    "no_repeat_ngram_size=3": {"no_repeat_ngram_size": 3},
    "no_repeat_ngram_size=4": {"no_repeat_ngram_size": 4},
    "repetition_penalty=1.2": {"repetition_penalty": 1.2},
    "repetition_penalty=1.2, max_len_a=1.2, max_len_b=5": {
        "repetition_penalty": 1.2, "max_len_a": 1.2, "max_len_b": 5},
}


def modern_pairs(path: Path = MODERN) -> list[tuple[str, str]]:
    """The (English, Spanish) pairs of the modern set; a line that is not two tab-separated
    fields is an error naming the file and line."""
    pairs = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.split("\t")
        if len(fields) != 2 or not all(f.strip() for f in fields):
            raise ValueError(f"{path}:{number}: expected 'english<TAB>spanish', got {line!r}")
        pairs.append((fields[0], fields[1]))
    return pairs


def repeats_a_trigram(text: str) -> bool:
    words = text.split()
    grams = [tuple(words[i:i + 3]) for i in range(len(words) - 2)]
    return len(grams) != len(set(grams))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--limit", type=int, default=0, help="the first N test verses")
    parser.add_argument("--beam", type=int, default=4)
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
    modern = modern_pairs()
    sources = [s for s, _ in modern]
    results = {}
    print(f"| setting | modern BLEU | chrF | repeating a 3-gram | at the length cap | "
          f"length ratio | test BLEU ({len(pairs)} verses) |\n|---|---|---|---|---|---|---|")
    for name, controls in SETTINGS.items():
        decode = run.decode_options(beam=args.beam, **controls)
        requests = run.requests(sources, decode)
        run.engine.run(list(requests.values()))
        hyps = [best[0][0] for best in run.results(sources, requests, decode)]
        scores = bleu_chrf(hyps, [t for _, t in modern])
        capped = sum(len(r.hypotheses()[0][0]) >= r.limit - 1
                     for r in requests.values()) / len(hyps)
        test = run.translate([s for s, _ in pairs], beam=args.beam, **controls)
        bleu = bleu_chrf(test, [t for _, t in pairs])["bleu"]
        looped = sum(map(repeats_a_trigram, hyps)) / len(hyps)
        ratio = sum(len(h.split()) for h in hyps) / sum(len(t.split()) for _, t in modern)
        results[name] = {"modern_bleu": round(scores["bleu"], 2),
                         "modern_chrf": round(scores["chrf"], 2), "repeating": looped,
                         "at_cap": capped, "length_ratio": round(ratio, 3),
                         "test_bleu": round(bleu, 2), "outputs": hyps}
        print(f"| {name} | {scores['bleu']:.2f} | {scores['chrf']:.1f} | {looped:.0%} | "
              f"{capped:.0%} | {ratio:.2f} | {bleu:.2f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"command": "python scripts/robustness.py " + " ".join(sys.argv[1:]),
             "run_dir": args.run_dir, "weights": args.weights, "beam": args.beam,
             "modern_sentences": len(modern), "test_sentences": len(pairs),
             "settings": results}, indent=2, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
