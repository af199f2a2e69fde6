"""Exported translators side by side: test sacreBLEU and sentences/s of one trained run,
decoded by vaswani (fp32, and bf16 where this CPU runs bf16 natively), CTranslate2 fp32 and
CTranslate2 int8 (and ONNX Runtime greedy with ``--onnx``), beam 4 unless ``--beam``.

    python -m benchmarks.export runs/bible-en-es [--limit N] [--json FILE]

Every engine translates the same sentences of the run's test split (its [data] config) with the
run's [decode] settings, in batches of the size each prefers, with the same number of threads.
The exports are written to a temporary folder. Prints a markdown table and the BLEU each
export loses against vaswani fp32; writes JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from .common import hardware


def _timed(fn, texts: list[str]) -> tuple[list[str], float]:
    start = time.perf_counter()
    out = fn(texts)
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--limit", type=int, default=0, help="the first N test sentences")
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--onnx", action="store_true", help="also ONNX Runtime (greedy)")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args()

    import vaswani
    from vaswani.data.files import ReadReport, iter_translation
    from vaswani.data.registry import default_cache
    from vaswani.devices import bf16_is_fast
    from vaswani.evaluation.metrics import bleu_chrf
    from vaswani.export import export
    from vaswani.inference.ct2 import CT2Translator

    torch.set_num_threads(args.threads)
    run = vaswani.load(args.run_dir)
    pairs = list(iter_translation(run.data_files("test", default_cache()), ReadReport()))
    if args.limit:
        pairs = pairs[:args.limit]
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    beam = args.beam
    engines: dict[str, object] = {
        "vaswani fp32": lambda texts: run.translate(texts, beam=beam)}
    if bf16_is_fast(torch.device("cpu")):
        bf16 = vaswani.load(args.run_dir)
        bf16.model.to(torch.bfloat16)
        engines["vaswani bf16"] = lambda texts: bf16.translate(texts, beam=beam)
    skipped = {} if "vaswani bf16" in engines else {
        "vaswani bf16": "not run: this CPU has no native bf16 (AVX512-BF16/AMX); PyTorch "
                        "emulates it far slower than fp32"}
    tmp = Path(tempfile.mkdtemp(prefix="vaswani-export-bench-"))
    for name, quantize in [("fp32", None), ("int8", "int8")]:
        export(args.run_dir, "ct2", tmp / name, quantize=quantize)
        engine = CT2Translator(tmp / name, compute_type="int8" if quantize else "float32",
                        threads=args.threads)
        engines[f"CTranslate2 {name}"] = (
            lambda texts, e=engine: e.translate(texts, beam=beam, batch_size=32))
    if args.onnx:
        export(args.run_dir, "onnx", tmp / "onnx")
        onnx = OnnxTranslator(tmp / "onnx")
        engines["ONNX Runtime fp32 (greedy)"] = lambda texts: onnx.translate(texts)

    results, rows = {}, []
    for name, fn in engines.items():
        fn(sources[:8])  # warm-up: threads, allocations
        hyps, seconds = _timed(fn, sources)
        scores = bleu_chrf(hyps, references)
        results[name] = {"bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
                         "seconds": round(seconds, 1),
                         "sentences_per_s": round(len(sources) / seconds, 2),
                         "bleu_signature": scores["bleu_signature"],
                         "examples": hyps[:3]}
        print(f"{name}: BLEU {scores['bleu']:.2f}, {len(sources) / seconds:.2f} sentences/s",
              flush=True)
    base = results["vaswani fp32"]
    ct2 = results["CTranslate2 fp32"]
    for name, r in results.items():
        r["bleu_vs_vaswani_fp32"] = round(r["bleu"] - base["bleu"], 2)
        r["speed_vs_ct2_fp32"] = round(r["sentences_per_s"] / ct2["sentences_per_s"], 2)
        rows.append((name, f"| {name} | {r['bleu']:.2f} | {r['bleu_vs_vaswani_fp32']:+.2f} | "
                           f"{r['sentences_per_s']:.2f} | {r['speed_vs_ct2_fp32']:.2f}x |"))
    for name, why in skipped.items():
        rows.append((name, f"| {name} | - | - | - | {why} |"))
    print(f"\n{len(sources)} test sentences, beam {beam}, {args.threads} threads\n")
    print("| engine | test BLEU | vs vaswani fp32 | sentences/s | vs CTranslate2 fp32 |\n"
          "|---|---|---|---|---|")
    for _, row in rows:
        print(row)
    summary = {"run_dir": args.run_dir, "sentences": len(sources), "beam": beam,
               "threads": args.threads, "engines": results, "skipped": skipped,
               "int8_bleu_loss": round(ct2["bleu"] - results["CTranslate2 int8"]["bleu"], 2),
               "hardware": hardware()}
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
        print(f"\nwrote {args.json}")



class OnnxTranslator:
    """Greedy translation with an ONNX export of an encoder-decoder run and ONNX Runtime,
    with the run's tokenizer (kept under ``vaswani/`` in the export)."""

    def __init__(self, folder: str | Path) -> None:
        import onnxruntime

        from vaswani import rundir

        folder = Path(folder)
        source = folder / "vaswani"
        self.config = rundir.read_config(source)
        self.source, self.target, _ = rundir.read_tokenizers(source)
        self.target = self.target or self.source
        opts = onnxruntime.SessionOptions()
        self.encoder = onnxruntime.InferenceSession(str(folder / "encoder.onnx"), opts,
                                                    providers=["CPUExecutionProvider"])
        self.decoder = onnxruntime.InferenceSession(str(folder / "decoder.onnx"), opts,
                                                    providers=["CPUExecutionProvider"])

    def translate(self, texts: list[str], max_len: int = 0) -> list[str]:
        import numpy as np

        c, d = self.config.model, self.config.decode
        rows = [self.source.encode(t)[: c.max_len - 1] + [self.source.eos_id] for t in texts]
        width = max(map(len, rows))
        ids = np.full((len(rows), width), c.pad_id, dtype=np.int64)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = r
        keep = ids != c.pad_id
        memory = self.encoder.run(None, {"input_ids": ids, "attention_mask": keep})[0]
        limit = [min(c.max_len - 1, max_len or int(d.max_len_a * len(r) + d.max_len_b))
                 for r in rows]
        out = np.full((len(rows), 1), self.target.bos_id, dtype=np.int64)
        done = np.zeros(len(rows), dtype=bool)
        for step in range(max(limit)):
            logits = self.decoder.run(None, {"decoder_input_ids": out, "memory": memory,
                                             "attention_mask": keep})[0][:, -1]
            logits[:, [c.pad_id, self.target.bos_id]] = -np.inf
            nxt = logits.argmax(-1)
            nxt[done] = c.pad_id
            nxt[~done & (step >= np.array(limit))] = self.target.eos_id
            done |= nxt == self.target.eos_id
            out = np.concatenate([out, nxt[:, None]], 1)
            if done.all():
                break
        texts_out = []
        for row in out[:, 1:].tolist():
            end = row.index(self.target.eos_id) if self.target.eos_id in row else len(row)
            texts_out.append(self.target.decode(row[:end]))
        return texts_out


if __name__ == "__main__":
    main()
