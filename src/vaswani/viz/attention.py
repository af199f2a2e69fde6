"""Attention heatmaps: what each position looked at.

``attention_maps`` runs the model once with ``need_weights=True`` (the reference attention
path, which returns weights) and collects, per kind of attention, a tensor (L, H, Tq, Tk)
with the token labels of its queries and keys. ``plot_attention`` draws one layer: one head of
every kind side by side, or a grid of all heads.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..data.batching import pad
from ..data.tokenizers import BOS_ID
from ..inference import Run


@torch.no_grad()
def attention_maps(run: Run, text: str, target: str | None = None) -> dict[str, dict]:
    """{kind: {"weights": (L, H, Tq, Tk), "queries": [...], "keys": [...]}}."""
    model, src_tok = run.model, run.source_tokenizer
    label = lambda tok, ids: [tok.token(i) for i in ids]  # noqa: E731
    if run.task == "translation":
        src_ids = run.encode([text], eos=True)[0]
        if target is None:
            target = run.translate([text], beam=1)[0]
        tgt_ids = [BOS_ID] + run.encode([target], tokenizer=run.target_tokenizer)[0]
        src = pad([src_ids]).to(run.device)
        tgt = pad([tgt_ids]).to(run.device)
        memory = model.encode(src, need_weights=True)
        model.decode(tgt, memory, src_mask=src != 0, need_weights=True)
        s, t = label(src_tok, src_ids), label(run.target_tokenizer, tgt_ids)
        return {
            "encoder self-attention": _stack(model.encoder, "last_weights", s, s),
            "decoder self-attention": _stack(model.decoder, "last_weights", t, t),
            "cross-attention": _stack(model.decoder, "last_cross_weights", t, s),
        }
    if run.task == "lm":
        ids = src_tok.encode(text)[: model.config.max_len] or [BOS_ID]
        model(torch.tensor([ids], device=run.device), need_weights=True)
        toks = label(src_tok, ids)
        return {"self-attention": _stack(model.decoder, "last_weights", toks, toks)}
    ids = run.encode([text], bos=True)[0]
    model.encode(torch.tensor([ids], device=run.device), need_weights=True)
    toks = label(src_tok, ids)
    return {"self-attention": _stack(model.encoder, "last_weights", toks, toks)}


def _stack(stack, attr: str, queries: list[str], keys: list[str]) -> dict:
    weights = torch.stack([getattr(layer, attr)[0] for layer in stack.layers])  # (L, H, Tq, Tk)
    return {"weights": weights.float().cpu(), "queries": queries, "keys": keys}


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

