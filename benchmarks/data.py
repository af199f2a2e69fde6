"""Data at scale: encoding and training on corpora of growing size, before and after encoded
datasets.

    python -m benchmarks.data [--sizes ...] [--before CHECKOUT] [--json OUT] [--work DIR]

The corpora are made from the prepared datasets by repetition (each copy shuffled): language
model text of 10 MB, 100 MB and 1 GB (shakespeare, the char tokenizer of the preset, and a
100 MB BPE row) and translation pairs of 30k, 300k and 3M (bible-en-es, shared BPE 8000).
For each: ``vaswani data encode`` (seconds, MB/s, peak memory), its encoding pass against
``tokenizers``' own batch encoding of the same texts, ``vaswani train`` from the warm cache
(seconds until one step is done, peak memory), and two DDP processes (memory per process).
With ``--before CHECKOUT`` the same ``vaswani train`` runs on an older checkout (which reads
and encodes inside ``train``), stopped past a memory or time limit.

Peak memory is sampled from /proc every 0.1 s over the whole process tree: RSS, and PSS
(proportional set size: pages shared between processes, like memory-mapped token files,
counted once in total). Wall times depend on the machine's load; compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from .common import ROOT, hardware

CACHE = Path(os.environ.get("VASWANI_CACHE") or Path.home() / ".cache" / "vaswani")
MIB = 1 << 20


def tree(pid: int) -> list[int]:
    """pid and all its descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                todo.extend(int(c) for c in (task / "children").read_text().split())
            except OSError:
                pass
    return out


def memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of one process in bytes (0, 0 if it is gone)."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def data_pss(pid: int) -> int:
    """PSS of the memory-mapped token files (*.bin, *.off) of one process, in bytes."""
    total, counting = 0, False
    try:
        for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
            if not line[:1].isupper() or line.split()[0].count("-") == 1:  # a mapping's header
                parts = line.split()
                counting = len(parts) >= 6 and parts[-1].endswith((".bin", ".off"))
            elif counting and line.startswith("Pss:"):
                total += int(line.split()[1]) * 1024
    except OSError:
        pass
    return total


def measure(cmd: list[str], *, env: dict | None = None, cwd: Path = ROOT,
            limit_bytes: int = 8 << 30, limit_s: float = 1500) -> dict:
    """Run ``cmd``; peak RSS and PSS over its process tree (total, and per process), wall time;
    stopped (and said so) past ``limit_bytes`` of RSS or ``limit_s`` seconds."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    peak_rss = peak_pss = peak_data = 0
    per: dict[int, int] = {}
    stopped = ""
    samples = 0
    while proc.poll() is None:
        pids = tree(proc.pid)
        sizes = {p: memory(p) for p in pids}
        samples += 1
        if samples % 10 == 0:  # smaps is slow to read: once a second
            peak_data = max(peak_data, sum(data_pss(p) for p in pids))
        rss = sum(r for r, _ in sizes.values())
        peak_rss = max(peak_rss, rss)
        peak_pss = max(peak_pss, sum(p for _, p in sizes.values()))
        for p, (r, _) in sizes.items():
            per[p] = max(per.get(p, 0), r)
        if rss > limit_bytes or time.perf_counter() - start > limit_s:
            stopped = (f"stopped past {limit_bytes / (1 << 30):.0f} GiB" if rss > limit_bytes
                       else f"stopped past {limit_s / 60:.0f} min")
            for p in reversed(pids):
                try:
                    os.kill(p, 9)
                except OSError:
                    pass
            break
        time.sleep(0.1)
    out, err = proc.communicate()
    return {"seconds": round(time.perf_counter() - start, 1), "rc": proc.returncode,
            "peak_rss_mib": round(peak_rss / MIB), "peak_pss_mib": round(peak_pss / MIB),
            "peak_data_pss_mib": round(peak_data / MIB),
            "per_process_rss_mib": sorted((round(v / MIB) for v in per.values()), reverse=True),
            "stopped": stopped, "stdout": out[-2000:], "stderr": err[-2000:]}


# --- corpora ----------------------------------------------------------------------------------

def lm_corpus(work: Path, mb: int) -> Path:
    path = work / f"lm-{mb}MB.txt"
    if not path.exists():
        plays = (CACHE / "datasets/shakespeare/train.txt").read_text().split("\n\n")
        rng = random.Random(mb)
        with path.open("w") as f:
            written = 0
            while written < mb * MIB:
                rng.shuffle(plays)
                block = "\n\n".join(plays) + "\n\n"
                f.write(block)
                written += len(block.encode())
    return path


def pair_corpus(work: Path, n: int) -> Path:
    path = work / f"pairs-{n}.tsv"
    if not path.exists():
        pairs = (CACHE / "datasets/bible-en-es/train.tsv").read_text().splitlines()
        rng = random.Random(n)
        with path.open("w") as f:
            left = n
            while left > 0:
                rng.shuffle(pairs)
                chunk = pairs[:left]
                f.write("\n".join(chunk) + "\n")
                left -= len(chunk)
    return path


def train_args(kind: str, corpus: Path, extra: list[str] = ()) -> list[str]:
    preset = "shakespeare-char" if kind.startswith("lm") else "bible-en-es"
    sets = ["data.dataset=", f"data.train={corpus}", "train.precision=fp32", "train.max_minutes=0",
            "train.max_steps=1", "train.eval_batches=2", "train.best_metric=valid_loss",
            "train.metric_examples=0", "train.log_every=1"]
    if kind == "lm-bpe":
        sets += ["data.tokenizer=bpe", "data.vocab_size=8000"]
    return [f"configs/{preset}.toml", *[x for s in [*sets, *extra] for x in ("--set", s)]]


# --- rows ---------------------------------------------------------------------------------------

def raw_encode_seconds(kind: str, corpus: Path, directory: Path) -> float:
    """Seconds ``tokenizers``' own batch encoding (encode_batch_fast) takes on the texts the
    encoding pass encoded, in the same batches; reading the file is not counted."""
    sys.path.insert(0, str(ROOT / "src"))
    from vaswani.data.encode import BATCH, CHUNKS_PER_BATCH, text_chunks
    from vaswani.data.files import ReadReport, iter_text_pieces
    from vaswani.data.tokenizers import load_tokenizers

    run = next(Path(directory.parent / "tokenizers").glob("*/tokenizer"), None)
    tok, _ = load_tokenizers(run)
    hf = tok.hf
    seconds = 0.0
    if kind == "pairs":
        batch: list[str] = []
        with corpus.open() as f:
            for line in f:
                src, tgt = line.rstrip("\n").split("\t")
                batch += [src, tgt]
                if len(batch) >= 2 * BATCH:
                    t = time.perf_counter()
                    hf.encode_batch_fast(batch, add_special_tokens=True)
                    seconds += time.perf_counter() - t
                    batch = []
        t = time.perf_counter()
        hf.encode_batch_fast(batch, add_special_tokens=True)
        return seconds + time.perf_counter() - t
    chunks: list[str] = []
    for _, chunk in text_chunks(iter_text_pieces([str(corpus)], ReadReport()), None):
        chunks.append(chunk)
        if len(chunks) == CHUNKS_PER_BATCH:
            t = time.perf_counter()
            hf.encode_batch_fast(chunks, add_special_tokens=True)
            seconds += time.perf_counter() - t
            chunks = []
    t = time.perf_counter()
    hf.encode_batch_fast(chunks, add_special_tokens=True)
    return seconds + time.perf_counter() - t


def row(kind: str, size: str, corpus: Path, work: Path, before: Path | None) -> dict:
    cache = work / f"cache-{kind}-{size}"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "VASWANI_CACHE": str(cache),
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    vaswani = [sys.executable, "-m", "vaswani"]
    mb = corpus.stat().st_size / MIB
    out: dict = {"corpus": kind, "size": size, "megabytes": round(mb, 1)}
    encode = measure(vaswani + ["data", "encode", *train_args(kind, corpus), "--no-progress"],
                     env=env)
    out["encode"] = {k: encode[k] for k in ("seconds", "peak_rss_mib", "stopped", "rc")}
    out["encode"]["mb_per_s"] = round(mb / max(encode["seconds"], 1e-9), 1)
    if encode["rc"] != 0:
        out["encode"]["error"] = encode["stderr"][-300:]
        return out
    task = "lm" if kind.startswith("lm") else "translation"
    directory = next((cache / "encoded").glob(f"{task}-*"))
    manifest = json.loads((directory / "manifest.json").read_text())
    out["encode"]["encode_pass_seconds"] = manifest["encode_seconds"]
    if kind != "lm":  # the char tokenizer is vaswani's own: no tokenizers counterpart
        raw = raw_encode_seconds("pairs" if kind == "pairs" else "lm", corpus, directory)
        out["encode"]["tokenizers_seconds"] = round(raw, 2)
        out["encode"]["pass_vs_tokenizers"] = round(manifest["encode_seconds"] / raw, 2)
    run = work / f"run-{kind}-{size}"
    first = measure(vaswani + ["train", *train_args(kind, corpus), "--out", str(run),
                               "--overwrite", "--no-progress"], env=env)
    out["train_warm"] = {"seconds_to_one_step": first["seconds"], "rc": first["rc"],
                         "peak_rss_mib": first["peak_rss_mib"],
                         "peak_pss_mib": first["peak_pss_mib"],
                         "data_pss_mib": first["peak_data_pss_mib"]}
    ddp = measure([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                   "--master_addr=127.0.0.1", f"--master_port={29500 + random.randint(0, 999)}",
                   "-m", "vaswani", "train", *train_args(kind, corpus, ["train.max_steps=2"]),
                   "--out", str(run), "--overwrite", "--no-progress"],
                  env={**env, "OMP_NUM_THREADS": "1"})
    out["ddp_2_ranks"] = {"rc": ddp["rc"], "per_process_rss_mib": ddp["per_process_rss_mib"],
                          "total_pss_mib": ddp["peak_pss_mib"],
                          "data_pss_mib": ddp["peak_data_pss_mib"]}
    if before is not None:
        old_env = {**env, "PYTHONPATH": str(before / "src"), "VASWANI_CACHE": str(cache / "old")}
        old = measure(vaswani + ["train", *train_args(kind, corpus), "--out", str(run) + "-old",
                                 "--overwrite", "--no-progress"], env=old_env, cwd=before)
        out["before_train"] = {k: old[k] for k in ("seconds", "peak_rss_mib", "stopped", "rc")}
    return out


SIZES = {"lm": {"10MB": 10, "100MB": 100, "1GB": 1024}, "lm-bpe": {"100MB": 100},
         "pairs": {"30k": 30_000, "300k": 300_000, "3M": 3_000_000}}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="*", help="e.g. lm:10MB pairs:30k (default: all)")
    parser.add_argument("--before", help="an older checkout to run `vaswani train` from")
    parser.add_argument("--work", default="/tmp/vaswani-bench-data", help="scratch folder")
    parser.add_argument("--json", default=str(ROOT / "docs/results/bench-data.json"))
    args = parser.parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    wanted = [tuple(s.split(":")) for s in args.sizes] if args.sizes else \
        [(k, s) for k, sizes in SIZES.items() for s in sizes]
    results = []  # rows of an earlier call with other --sizes are kept
    if Path(args.json).exists():
        results = [r for r in json.loads(Path(args.json).read_text())
                   if (r["corpus"], r["size"]) not in wanted]
    for kind, size in wanted:
        amount = SIZES[kind][size]
        corpus = lm_corpus(work, amount) if kind.startswith("lm") else pair_corpus(work, amount)
        result = row(kind, size, corpus, work, Path(args.before) if args.before else None)
        result.update(machine=hardware(), date=time.strftime("%Y-%m-%d"))  # rows of other
        # calls, kept above, may come from other machines: each row says its own
        results.append(result)
        print(json.dumps(result), flush=True)
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
