"""Virtual environments of their own for peers with heavy requirements (lm-evaluation-harness),
made once and cached: a peer is run as its users run it, in a process of its own, and never
installed into vaswani's environment. The CPU build of torch the project pins goes in first,
so that a peer's own ``torch`` requirement is met without pulling a CUDA build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

CACHE = Path(os.environ.get("VASWANI_CACHE") or Path.home() / ".cache" / "vaswani")


def peer_venv(name: str, packages: list[str], *, timeout: float = 1800) -> Path:
    """``CACHE/venvs/NAME`` with ``packages`` installed beside this torch; its ``python``.
    Made once (a marker file lists what it holds); a half-made one, or one made for other
    packages, is made again."""
    root = CACHE / "venvs" / name
    python = root / "bin" / "python"
    marker = root / ".complete"
    wanted = " ".join(packages) + "\n"
    if marker.exists() and python.exists() and marker.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True,
                   timeout=timeout)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    torch_pin = f"torch=={torch.__version__.split('+')[0]}"
    for step in ([torch_pin], [*packages, torch_pin]):
        done = subprocess.run([*pip, *step], capture_output=True, text=True, timeout=timeout)
        if done.returncode:
            raise RuntimeError(f"could not install {' '.join(step)} into {root}:\n"
                               f"{done.stderr[-3000:]}")
    marker.write_text(wanted)
    return python
