"""Tiny data files and configs for training tests."""

import random
from pathlib import Path


def reverse_task(path: Path, n: int = 300, seed: int = 0) -> Path:
    """source<TAB>target lines where the target is the source reversed."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        s = "".join(rng.choice("abcdef") for _ in range(rng.randint(3, 12)))
        lines.append(f"{s}\t{s[::-1]}")
    path.write_text("\n".join(lines) + "\n")
    return path


def text_file(path: Path, n: int = 3000, seed: int = 0) -> Path:
    rng = random.Random(seed)
    words = ["to", "be", "or", "not", "that", "is", "the", "question"]
    path.write_text(" ".join(rng.choice(words) for _ in range(n)) + "\n")
    return path


def classification_file(path: Path, n: int = 200, seed: int = 0) -> Path:
    rng = random.Random(seed)
    rows = ["label\ttext"]
    for _ in range(n):
        label = rng.choice(["pos", "neg"])
        word = "good" if label == "pos" else "bad"
        rows.append(f"{label}\t{' '.join(rng.choice(['a', 'b', 'c', word]) for _ in range(6))}")
    path.write_text("\n".join(rows) + "\n")
    return path


def config(path: Path, arch: str, train_file: Path, *, dropout: float = 0.0,
           train: dict | None = None, data: dict | None = None,
           model: dict | None = None, device: str | None = None) -> Path:
    """A small config for ``arch`` on ``train_file``; dicts override section values.

    It trains on ``device`` (default: `pytest --device`) and eagerly: compiling (``compile =
    "auto"`` does on CUDA) costs a tiny run more than it saves, and the compiled step has tests
    of its own that ask for it (``compile=True``)."""
    from tests import conftest
    from vaswani.config import dump_toml

    sections = {
        "model": {"arch": arch, "dropout": dropout, "d_model": 32, "n_heads": 4, "d_ff": 64,
                  "n_layers": 2, "max_len": 64, **(model or {})},
        "data": {"train": str(train_file), "tokenizer": "char", "max_tokens": 400,
                 "batch_size": 8, "block_size": 32, **(data or {})},
        "train": {"device": device or str(conftest.DEVICE), "compile": False,
                  "max_steps": 20, "lr": 1e-3, "warmup": 5, "schedule": "noam",
                  "eval_every": 10, "save_every": 10, "log_every": 1, "metric_examples": 16,
                  **(train or {})},
    }
    path.write_text(dump_toml(sections))
    return path


def cpu_config(*args, **kwargs) -> Path:
    """:func:`config` on the CPU whatever `pytest --device` says: for jobs of several
    processes (gloo), which on CUDA would need a GPU each."""
    return config(*args, device="cpu", **kwargs)


def train_in_one_and_two_processes(cfg: Path, folder: Path) -> tuple[Path, Path]:
    """``vaswani train cfg`` in one process (into ``folder/one``) and under torchrun's two
    DDP processes (``folder/two``), one thread each; returns the two run directories."""
    import os
    import subprocess
    import sys

    from tests import processes

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    one = subprocess.run([sys.executable, "-m", "vaswani", "train", str(cfg), "--out",
                          str(folder / "one"), "--no-progress"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    two = processes.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                         "--master_addr=127.0.0.1", f"--master_port={processes.free_port()}",
                         "-m", "vaswani", "train", str(cfg), "--out", str(folder / "two"),
                         "--no-progress"], env=env, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    return folder / "one", folder / "two"
