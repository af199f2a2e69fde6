"""Loss curves from ``metrics.jsonl``."""

from __future__ import annotations

from pathlib import Path


def plot_loss(metrics_path: Path, out_path: Path) -> Path | None:
    """Training loss and validation loss against step, as a PNG. None if nothing to plot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ..rundir import read_metrics

    rows = [r for r in read_metrics(metrics_path) if "loss" in r]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label="train loss")
    valid = [r for r in rows if "valid_loss" in r]
    if valid:
        ax.plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o-",
                label="valid loss (NLL)")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss (nats per target)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title(metrics_path.parent.name)
    fig.tight_layout()
    fig.savefig(out_path)
    plt.close(fig)
    return out_path
