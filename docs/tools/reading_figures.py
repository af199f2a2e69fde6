"""Draw the pictures of docs/reading.md ("Reading the Transformer") from vaswani's own code
and a trained translator.

    python docs/tools/reading_figures.py [RUN_DIR] [--out docs/images/reading]

RUN_DIR is an encoder-decoder run, by default the one `make demo` trains
(runs/demo-bible-en-es, English -> Spanish). Every picture is computed, not drawn by hand:
the positional table by ``sinusoidal_table``, the masks by ``nn/masks.py``, the label-smoothed
target by ``models/losses.py``'s reference loss, the attention maps by the run itself
(``Translator.attention``: one forward pass with the written-out attention).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

SENTENCE = "The Lord is my shepherd; I shall not want."


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def positional(out: Path) -> Path:
    """The sinusoidal table (positions x dimensions) and four of its dimensions over position."""
    from vaswani.nn.positional import sinusoidal_table

    plt = _plt()
    table = sinusoidal_table(64, 128)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
    a.imshow(table.T.numpy(), cmap="RdBu", aspect="auto", vmin=-1, vmax=1)
    a.set_xlabel("position")
    a.set_ylabel("dimension")
    a.set_title("sinusoidal_table(64, 128)")
    for d in (0, 1, 16, 64):
        b.plot(table[:, d].numpy(), label=f"dimension {d}")
    b.set_xlabel("position")
    b.set_title("each dimension is a sinusoid; lower ones turn faster")
    b.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def masks(out: Path) -> Path:
    """Padding, causal and the decoder's combined mask for a batch of one 4-token sequence
    padded to 6 (True = may attend, drawn yellow)."""
    from vaswani.nn.masks import causal_mask, decoder_self_mask, key_padding_mask, padding_mask

    plt = _plt()
    ids = torch.tensor([[5, 6, 7, 8, 0, 0]])
    keep = padding_mask(ids, pad_id=0)
    shown = {"key_padding_mask (encoder)": key_padding_mask(keep)[0, 0].expand(6, 6),
             "causal_mask(6)": causal_mask(6),
             "decoder_self_mask": decoder_self_mask(keep, 6)[0, 0]}
    fig, axes = plt.subplots(1, 3, figsize=(10, 3.4))
    for ax, (title, m) in zip(axes, shown.items(), strict=True):
        ax.imshow(m.float().numpy(), cmap="viridis", vmin=0, vmax=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key position")
        ax.set_ylabel("query position")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def label_smoothing(out: Path) -> Path:
    """The distribution the loss compares the model with, for one target token, without and
    with label smoothing 0.1 over a 10-token vocabulary (token 0 is padding), read back from
    ``models/losses.py``'s reference loss: at uniform logits its gradient is p - q, so the
    target distribution q is p minus the gradient."""
    from vaswani.models.losses import reference_smoothed_cross_entropy

    plt = _plt()
    vocab, target = 10, torch.tensor([3])

    def wanted(smoothing: float) -> torch.Tensor:
        logits = torch.zeros(1, vocab, dtype=torch.float64, requires_grad=True)
        loss, _, _ = reference_smoothed_cross_entropy(logits, target, smoothing=smoothing,
                                                      pad_id=0)
        loss.backward()
        return (logits.softmax(-1) - logits.grad)[0].detach()

    fig, ax = plt.subplots(figsize=(6, 2.8))
    ax.bar(torch.arange(vocab) - 0.2, wanted(0.0), width=0.4, label="one-hot target")
    ax.bar(torch.arange(vocab) + 0.2, wanted(0.1), width=0.4, label="smoothed, eps = 0.1")
    ax.set_xlabel("token id (0 = padding, 3 = the target)")
    ax.set_xticks(range(vocab))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def attention_maps(run_dir: Path, out_dir: Path) -> list[Path]:
    """The trained run's attention for SENTENCE and its own translation: every head of the
    last layer, for each kind of attention."""
    import vaswani
    from vaswani.viz.attention import plot_attention

    run = vaswani.load(run_dir)
    maps = run.attention(SENTENCE)
    names = {"encoder self-attention": "encoder-self", "decoder self-attention":
             "decoder-self", "cross-attention": "cross"}
    written = []
    for kind, name in names.items():
        written.append(plot_attention({kind: maps[kind]}, out_dir / f"{name}.png",
                                      layer=-1, head=None))
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", default="runs/demo-bible-en-es",
                        help="a trained encoder-decoder run (default: make demo's)")
    parser.add_argument("--out", default="docs/images/reading", help="folder for the PNGs")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_dir = Path(args.run_dir)
    if not (run_dir / "config.toml").exists():
        print(f"reading_figures.py: {run_dir} is not a run directory; train one with "
              "`make demo` first", file=sys.stderr)
        return 2
    written = [positional(out / "positional.png"), masks(out / "masks.png"),
               label_smoothing(out / "label-smoothing.png"), *attention_maps(run_dir, out)]
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
