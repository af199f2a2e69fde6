"""``vaswani evaluate``: score a run on a data file, one JSON object out.

* translation: detokenized sacreBLEU and chrF (with their signatures) of beam-search output;
* language model: loss (nats per token), perplexity, bits per token and bits per character
  over the whole text, read in consecutive windows of the model's ``max_len``;
* classifier: accuracy, macro-F1 and the confusion matrix (rows: true label, columns:
  predicted label, in the order of ``labels``).
"""

from __future__ import annotations

import math

import torch

from ..data import files
from ..data.batching import lm_eval_windows
from ..data.files import DataError, ReadReport
from ..inference import Run
from ..training.losses import smoothed_cross_entropy
from .metrics import bleu_chrf


def evaluate(run: Run, paths: list[str], *, fmt: str = "auto", beam: int | None = None) -> dict:
    report = ReadReport(max_skip=run.config.data.max_skip)
    if run.task == "translation":
        pairs = files.read_translation(paths, report)
        hyps = run.translate([s for s, _ in pairs], beam=beam)
        result = {"task": "translation", "sentences": len(pairs),
                  "beam": run.config.decode.beam if beam is None else beam,
                  **bleu_chrf(hyps, [t for _, t in pairs])}
    elif run.task == "lm":
        result = {"task": "lm", **language_model_scores(run, files.read_text(paths, report))}
    else:
        result = {"task": "classification",
                  **classification_scores(run, files.read_classification(paths, fmt, report))}
    if report.summary():
        result["data_notes"] = report.summary()
    return result


@torch.no_grad()
def language_model_scores(run: Run, text: str) -> dict:
    ids = torch.tensor(run.source_tokenizer.encode(text), dtype=torch.long)
    if ids.numel() < 2:
        raise DataError("the evaluation text is shorter than two tokens")
    nll = count = 0.0
    for x, y in lm_eval_windows(ids, run.config.model.max_len):
        x, y = x.to(run.device), y.to(run.device)
        logits = run.model(x, mask=torch.ones_like(x, dtype=torch.bool))
        _, batch_nll, n = smoothed_cross_entropy(logits.flatten(0, 1), y.flatten())
        nll += float(batch_nll)
        count += int(n)
    chars = len(text) - len(run.source_tokenizer.decode(ids[:1].tolist()))  # predicted chars
    loss = nll / count
    return {"tokens": int(count), "loss": loss, "perplexity": math.exp(min(loss, 50.0)),
            "bits_per_token": loss / math.log(2),
            "bits_per_char": nll / max(1, chars) / math.log(2)}


def classification_scores(run: Run, examples: list[tuple[str, str]]) -> dict:
    labels = run.labels
    index = {label: i for i, label in enumerate(labels)}
    unknown = sorted({label for label, _ in examples if label not in index})
    if unknown:
        raise DataError(f"labels {unknown} are not among the model's labels {labels}")
    predicted = [label for label, _ in run.classify([t for _, t in examples])]
    confusion = [[0] * len(labels) for _ in labels]
    for (truth, _), guess in zip(examples, predicted, strict=True):
        confusion[index[truth]][index[guess]] += 1
    f1s = []
    for k in range(len(labels)):
        tp = confusion[k][k]
        fp = sum(confusion[r][k] for r in range(len(labels))) - tp
        fn = sum(confusion[k]) - tp
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    correct = sum(confusion[k][k] for k in range(len(labels)))
    return {"examples": len(examples), "accuracy": correct / max(1, len(examples)),
            "macro_f1": sum(f1s) / len(f1s), "labels": labels, "confusion": confusion}
