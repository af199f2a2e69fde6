"""The two implementations vaswani is measured against, with the same embeddings, output
projection and loss, so that only the Transformer itself differs.

* ``TorchTransformer``: ``torch.nn.Transformer`` (pre-LN, batch_first) between sinusoidal
  embeddings and a tied output projection.
* ``NaiveTransformer``: the tutorial-style code found in many blog posts: separate q/k/v
  matmuls, ``masked_fill(-1e9)``, a LayerNorm that uses the unbiased ``std`` with eps outside
  the root, dropout modules everywhere. Correct enough to train, written for reading, not speed.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from vaswani.nn.positional import sinusoidal_table


class _Embed(nn.Module):
    def __init__(self, vocab: int, d: int, max_len: int, dropout: float) -> None:
        super().__init__()
        self.token = nn.Embedding(vocab, d, padding_idx=0)
        self.register_buffer("pe", sinusoidal_table(max_len, d), persistent=False)
        self.drop = nn.Dropout(dropout)
        self.scale = math.sqrt(d)

    def forward(self, ids: Tensor) -> Tensor:
        return self.drop(self.token(ids) * self.scale + self.pe[: ids.size(1)])


class TorchTransformer(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, d_ff: int, layers: int, dropout: float,
                 max_len: int = 512) -> None:
        super().__init__()
        self.embed = _Embed(vocab, d, max_len, dropout)
        self.transformer = nn.Transformer(d, heads, layers, layers, d_ff, dropout,
                                          batch_first=True, norm_first=True)
        self.proj = nn.Linear(d, vocab, bias=False)
        self.proj.weight = self.embed.token.weight

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_pad, tgt_pad = src == 0, tgt == 0  # torch's polarity: True = ignore
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.size(1), device=tgt.device,
                                                                dtype=torch.bool)
        h = self.transformer(self.embed(src), self.embed(tgt), tgt_mask=causal,
                             src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                             memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return self.proj(h)


# --- the tutorial version -----------------------------------------------------------------
class NaiveLayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.a, self.b, self.eps = nn.Parameter(torch.ones(d)), nn.Parameter(torch.zeros(d)), eps

    def forward(self, x: Tensor) -> Tensor:
        return self.a * (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + self.eps) \
            + self.b


class NaiveAttention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.h, self.dk = heads, d // heads
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d) for _ in range(4))
        self.drop = nn.Dropout(dropout)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        B = q.size(0)
        q, k, v = (w(x).view(B, -1, self.h, self.dk).transpose(1, 2)
                   for w, x in ((self.wq, q), (self.wk, k), (self.wv, v)))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.dk)
        scores = scores.masked_fill(mask == 0, -1e9)
        p = self.drop(scores.softmax(-1))
        return self.wo((p @ v).transpose(1, 2).contiguous().view(B, -1, self.h * self.dk))


class NaiveFF(nn.Module):
    def __init__(self, d: int, d_ff: int, dropout: float) -> None:
        super().__init__()
        self.w1, self.w2, self.drop = nn.Linear(d, d_ff), nn.Linear(d_ff, d), nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(self.drop(torch.relu(self.w1(x))))


class NaiveLayer(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int, dropout: float, cross: bool) -> None:
        super().__init__()
        self.self_attn = NaiveAttention(d, heads, dropout)
        self.cross_attn = NaiveAttention(d, heads, dropout) if cross else None
        self.ff = NaiveFF(d, d_ff, dropout)
        self.norms = nn.ModuleList(NaiveLayerNorm(d) for _ in range(3 if cross else 2))
        self.drop = nn.Dropout(dropout)

    def forward(self, x, mask, memory=None, memory_mask=None):
        h = self.norms[0](x)
        x = x + self.drop(self.self_attn(h, h, h, mask))
        if self.cross_attn is not None:
            h = self.norms[1](x)
            x = x + self.drop(self.cross_attn(h, memory, memory, memory_mask))
        return x + self.drop(self.ff(self.norms[-1](x)))


class NaiveTransformer(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, d_ff: int, layers: int, dropout: float,
                 max_len: int = 512) -> None:
        super().__init__()
        self.embed = _Embed(vocab, d, max_len, dropout)
        self.encoder = nn.ModuleList(NaiveLayer(d, heads, d_ff, dropout, False)
                                     for _ in range(layers))
        self.decoder = nn.ModuleList(NaiveLayer(d, heads, d_ff, dropout, True)
                                     for _ in range(layers))
        self.enc_norm, self.dec_norm = NaiveLayerNorm(d), NaiveLayerNorm(d)
        self.proj = nn.Linear(d, vocab, bias=False)
        self.proj.weight = self.embed.token.weight

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        src_mask = (src != 0)[:, None, None, :]
        T = tgt.size(1)
        tgt_mask = (tgt != 0)[:, None, None, :] & torch.tril(
            torch.ones(T, T, dtype=torch.bool, device=tgt.device))
        m = self.embed(src)
        for layer in self.encoder:
            m = layer(m, src_mask)
        m = self.enc_norm(m)
        x = self.embed(tgt)
        for layer in self.decoder:
            x = layer(x, tgt_mask, m, src_mask)
        return self.proj(self.dec_norm(x))
