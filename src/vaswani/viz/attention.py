"""Attention heatmaps: what each position looked at.

The maps come from ``Run.attention`` (each task's ``attention``, which runs the model once
with the written-out attention and returns, per kind of attention, the (L, H, Tq, Tk) weights
with the token labels of its queries and keys). ``plot_attention`` draws one layer: one head
of every kind side by side, or a grid of all heads.
"""

from __future__ import annotations

from pathlib import Path


def plot_attention(maps: dict[str, dict], out: Path, *, layer: int = -1,
                   head: int | None = 0) -> Path:
    """Draw layer ``layer``: head ``head`` of each kind, or every head when ``head`` is None."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(maps)
    n_layers, n_heads = maps[kinds[0]]["weights"].shape[:2]
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer ({layer}) must be in [0, {n_layers})")
    if head is not None and not 0 <= head < n_heads:
        raise ValueError(f"head ({head}) must be in [0, {n_heads})")
    heads = list(range(n_heads)) if head is None else [head]
    size = max(len(maps[k]["keys"]) for k in kinds)
    cell = min(0.35, 8 / max(1, size))
    fig, axes = plt.subplots(len(kinds) if head is None else 1,
                             len(heads) if head is None else len(kinds),
                             figsize=(max(4, cell * size * (len(heads) if head is None else
                                                            len(kinds)) + 2),
                                      max(3.5, cell * size * (len(kinds) if head is None
                                                              else 1) + 1.5)),
                             squeeze=False)
    for r, kind in enumerate(kinds):
        m = maps[kind]
        for c, h in enumerate(heads):
            ax = axes[r][c] if head is None else axes[0][r]
            ax.imshow(m["weights"][layer, h].numpy(), cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(range(len(m["keys"])), m["keys"], rotation=90, fontsize=7)
            ax.set_yticks(range(len(m["queries"])), m["queries"], fontsize=7)
            ax.set_title(f"{kind}\nlayer {layer % n_layers}, head {h}", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out

