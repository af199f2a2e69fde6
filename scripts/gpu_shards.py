"""The CUDA test suite in shards that each fit one short call of a lent GPU machine, and the
record of which shard passed at which commit, so that several short runs finish the suite.

    python scripts/gpu_shards.py files K N        # shard K of N (1-based): its test files
    python scripts/gpu_shards.py record OUT...    # merge gpu_check.sh's shard-*.json results
                                                  # into docs/results/gpu-suite.json
    python scripts/gpu_shards.py status [N]       # which shards of N passed at HEAD's code
    python scripts/gpu_shards.py result LOG K/N VERSION RC SECONDS DEVICE  # gpu_check.sh's
                                                  # JSON for one shard, read from its log

A shard is a set of whole test files (DEVICE_TESTS, the folders whose code runs on the
device), dealt out largest first to the shard with the fewest lines so far: the shards are
of like size and the same for the same files. scripts/gpu_check.sh ``tests K/N`` runs one
and writes ``$OUT/shard-K-of-N.json``: the commit, the shard, the counts, what failed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVICE_TESTS = ("tests/cuda", "tests/nn", "tests/models", "tests/generation", "tests/engine",
                "tests/inference", "tests/serve", "tests/export", "tests/training",
                "tests/test_devices.py", "tests/test_legacy_runs.py")
RECORD = ROOT / "docs" / "results" / "gpu-suite.json"


def test_files() -> list[Path]:
    files: list[Path] = []
    for entry in DEVICE_TESTS:
        path = ROOT / entry
        files += sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
    return files


def shards(n: int) -> list[list[str]]:
    """The test files dealt into ``n`` shards of like size (lines of test code)."""
    if n < 1:
        raise ValueError(f"N ({n}) must be at least 1")
    sized = sorted(((len(f.read_text().splitlines()), f.relative_to(ROOT).as_posix())
                    for f in test_files()), key=lambda x: (-x[0], x[1]))
    out: list[list[str]] = [[] for _ in range(n)]
    lines = [0] * n
    for size, name in sized:
        k = min(range(n), key=lambda i: (lines[i], i))
        out[k].append(name)
        lines[k] += size
    return [sorted(s) for s in out]


def code_version() -> str:
    """The commit of the code under test (HEAD), with "+changes" if the tree differs."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                          capture_output=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "src", "tests"], cwd=ROOT,
                           text=True, capture_output=True).stdout.strip()
    return head + ("+changes" if dirty else "")


def record(results: list[Path], into: Path = RECORD) -> dict:
    """Merge shard results (gpu_check.sh's JSON) into the record: per "K/N", the newest."""
    book = json.loads(into.read_text()) if into.exists() else {"shards": {}}
    for path in results:
        result = json.loads(path.read_text())
        book["shards"][result["shard"]] = result
    into.parent.mkdir(parents=True, exist_ok=True)
    into.write_text(json.dumps(book, indent=2, sort_keys=True) + "\n")
    return book


def result(log: str, shard: str, version: str, rc: int, seconds: int, device: str) -> dict:
    """One shard's result from its pytest log: the counts of pytest's last summary line
    (with or without -q's rule of "=") and each failed or erroring test's whole id
    (parametrized ids hold spaces: "test_x[n (9) is over]")."""
    counts = re.findall(r"^=*\s*(\d+ (?:passed|failed|errors?|skipped)\b.*?) in [0-9.]+s",
                        log, re.M)
    failed = re.findall(r"^(?:FAILED|ERROR) (.+?)(?: - .*)?$", log, re.M)
    return {"shard": shard, "commit": version, "passed": rc == 0, "rc": rc,
            "counts": counts[-1] if counts else "no summary (cut off?)", "failed": failed,
            "seconds": seconds, "device": device}


def status(n: int, into: Path = RECORD) -> list[tuple[str, str]]:
    """(shard, what the record says of it) for each of ``n`` shards."""
    book = json.loads(into.read_text()) if into.exists() else {"shards": {}}
    out = []
    for k in range(1, n + 1):
        r = book["shards"].get(f"{k}/{n}")
        out.append((f"{k}/{n}", "not run" if r is None else
                    f"{'passed' if r['passed'] else 'FAILED'} at {r['commit']} on {r['device']}"
                    f" ({r['counts']})"))
    return out


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "files":
        k, n = int(argv[1]), int(argv[2])
        if not 1 <= k <= n:
            raise SystemExit(f"shard {k} of {n}: K must be in 1..N")
        print(" ".join(shards(n)[k - 1]))
    elif argv and argv[0] == "record" and len(argv) > 1:
        book = record([Path(a) for a in argv[1:]])
        print(f"recorded {len(argv) - 1} shard result(s) in {RECORD} "
              f"({len(book['shards'])} shard(s) in all)")
    elif argv and argv[0] == "status":
        for shard, said in status(int(argv[1]) if len(argv) > 1 else 4):
            print(f"{shard}: {said}")
    elif len(argv) == 7 and argv[0] == "result":
        log, shard, version, rc, seconds, device = argv[1:]
        print(json.dumps(result(Path(log).read_text(errors="replace"), shard, version, int(rc),
                                int(seconds), device), indent=2))
    elif argv == ["version"]:
        print(code_version())
    else:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
