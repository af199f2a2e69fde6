"""The vocabulary projection and its cross-entropy together, so that training never holds
a language model's (N, V) logits: :func:`head_cross_entropy` takes the hidden states and the
head, where models/losses.py's losses take logits, and gives the same loss and gradients.

A frozen float head (LoRA's, and any run whose head does not train) goes through its
vocabulary a block of words at a time, all the rows of a chunk at once, the way flash
attention goes through its keys: each block's logits are made, folded into each row's
running maximum and sum of exponentials, and their softmax, scaled to the running maximum,
multiplied by the block's weights into the gradient of the hidden states, so each block of
weights is read once while it is in the cache, and every product has hundreds of rows (on a
2-core AVX2 EPYC a head's product by 85 rows ran at two-thirds of its speed by 512). Other
heads (one that trains, whose weight's gradient needs each row's final softmax; a quantized
one, whose loss is its own kernel's product) go through the rows a chunk at a time instead.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..cpu.linear import times_transposed
from .losses import _chunk_sums, _chunks, _other_classes, smoothed_cross_entropy

# logits made at a time: 16 MiB in float32 (a chunk of rows by all the words, or a block of
# words by all the rows of a chunk)
HEAD_CHUNK_ELEMENTS = 1 << 22


def head_cross_entropy(h: Tensor, head: nn.Module, target: Tensor, *, smoothing: float = 0.0,
                       pad_id: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`smoothed_cross_entropy` of ``head(h)``, hidden states (N, D) through the
    vocabulary projection ``head``, without ever holding the (N, V) logits or their gradient:
    a block of logits at a time, each made, turned into the loss and into the gradient of
    ``h`` (and of the head's weight where it trains), then freed (:class:`_HeadCrossEntropy`,
    the module docstring). With SmolLM2's 49,152 words and 512 targets that is 200 MB
    of float32 logits and gradient a step that never exist. Only the loss carries a gradient
    (the NLL beside it is for reading). A head without a plain weight matrix (an adapter on
    it, a bias that trains) is applied whole instead. Returns (loss sum, NLL sum, count)."""
    int8 = _frozen(head) and getattr(head, "bits", None) == 8  # read a block of words at a time
    if not (int8 or _has_matrix(head)):
        return smoothed_cross_entropy(head(h), target, smoothing=smoothing, pad_id=pad_id)
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    if not torch.is_grad_enabled():  # validation: the loss alone, no gradient, no matrix made
        h, weight, weight_rows = h.detach(), None, None
    elif int8:
        weight, weight_rows = None, head.dequantized_rows
    else:
        weight, weight_rows = head_matrix(head), None
    loss, nll = _HeadCrossEntropy.apply(h, weight, target, keep, smoothing, pad_id, head,
                                        weight_rows)
    return loss, nll, keep.sum()


def head_matrix(head: nn.Module) -> Tensor | None:
    """The (V, D) matrix whose product with a hidden state ``head`` computes, for its input's
    gradient: a linear layer's weight, a 4-bit layer's weights as it multiplies by them
    (``dequantized()``, frozen); None where that is not all the layer is (a trained bias,
    adapters) or where the weight is read a block of rows at a time (an int8 layer)."""
    if not _has_matrix(head):
        return None
    return head.weight if isinstance(head, nn.Linear) else head.dequantized()


def _has_matrix(head: nn.Module) -> bool:
    """Whether :func:`head_matrix` has a matrix to give, without making it."""
    if isinstance(head, nn.Linear):  # x W^T (cpu/linear.py's faster one too, in training)
        return head.bias is None
    return hasattr(head, "dequantized") and _frozen(head) and getattr(head, "bits", None) != 8


def _frozen(module: nn.Module) -> bool:
    return all(not p.requires_grad for p in module.parameters())


# words at a time: of a frozen float head's logits (_words_at_a_time), and of an int8 head
# dequantized (9 MiB of float32 at D = 576, a block small enough to fit the holes a
# recomputed step leaves in glibc's heap; 8,192 words grew int4 QLoRA's peak by about 65 MB
# at the same speed: docs/performance.md)
ROW_BLOCK = 4096


class _HeadCrossEntropy(torch.autograd.Function):
    """Forward does the work of both passes: the loss, and its gradient g = d loss / d x of
    the logits x (:class:`_ChunkedSmoothedCE`'s, for an upstream gradient of one), which goes
    straight into d h = g W and, where the weight trains, d W += g^T h; a frozen float head
    a block of words at a time (:func:`_words_at_a_time`), any other a chunk of rows at a
    time, its logits the layer's own product (so the loss is the one ``head(h)`` gives).
    Backward only scales those by the loss's upstream gradient."""

    @staticmethod
    def forward(ctx, h, weight, target, keep, smoothing, pad_id, head, weight_rows):
        N, V = h.size(0), head.out_features
        acc = torch.promote_types(h.dtype, torch.float32)
        K = _other_classes(V, pad_id)
        wanted = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]  # not when validating
        grad_h = torch.empty(h.shape, dtype=acc, device=h.device) if wanted else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=h.device) \
            if ctx.needs_input_grad[1] else None
        loss_sum = torch.zeros((), dtype=acc, device=h.device)
        nll_sum = torch.zeros((), dtype=acc, device=h.device)
        w = None if weight is None else weight.detach().to(acc)
        by_words = wanted and grad_w is None and isinstance(head, nn.Linear)

        def times_weight(g: Tensor) -> Tensor:  # g W, W whole or a block of rows at a time
            if w is not None:
                return g @ w
            out = torch.zeros(g.size(0), h.size(1), dtype=acc, device=h.device)
            for start in range(0, V, ROW_BLOCK):
                stop = min(start + ROW_BLOCK, V)
                out.addmm_(g[:, start:stop], weight_rows(start, stop).to(acc))
            return out

        with torch.no_grad():
            for rows in _chunks(N, min(ROW_BLOCK, V) if by_words else V, h.device,
                                HEAD_CHUNK_ELEMENTS):
                if by_words:
                    loss, nll, grad_h[rows] = _words_at_a_time(
                        h[rows].to(acc), w, target[rows], keep[rows], smoothing, pad_id)
                    # new sums, not in place (losses.py's _ChunkedSmoothedCE says why)
                    loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
                    continue
                x, y, k = head(h[rows].detach()).to(acc), target[rows, None], keep[rows]
                lse = torch.logsumexp(x, dim=-1)
                nll, loss = _chunk_sums(x, lse, y[:, 0], k, smoothing, pad_id)
                loss_sum, nll_sum = loss_sum + loss, nll_sum + nll
                if not wanted:
                    continue
                g = x.sub_(lse[:, None]).exp_()  # softmax, in the logits' place
                if smoothing:
                    g -= smoothing / K
                    if pad_id is not None:
                        g[:, pad_id] += smoothing / K  # padding gets no smoothing mass
                g.scatter_add_(1, y, torch.full(y.shape, smoothing / K - (1.0 - smoothing),
                                                dtype=acc, device=h.device))
                g.mul_(k[:, None])
                grad_h[rows] = times_weight(g)
                if grad_w is not None:
                    grad_w.addmm_(g.T, h[rows].to(acc))
        ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = h.dtype, None if weight is None else weight.dtype
        ctx.mark_non_differentiable(nll_sum)
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        grad_h, grad_w = ctx.saved_tensors
        grad_h = (grad_h * g_loss).to(ctx.dtypes[0])
        grad_w = None if grad_w is None else (grad_w * g_loss).to(ctx.dtypes[1])
        return grad_h, grad_w, None, None, None, None, None, None


def _words_at_a_time(h: Tensor, w: Tensor, y: Tensor, keep: Tensor, smoothing: float,
                     pad_id: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """(loss sum, NLL sum, d loss / d h) of rows ``h`` (n, D) through the frozen head ``w``
    (V, D), ROW_BLOCK words at a time. Each block's logits x_b = h w_b^T are folded into
    each row's running maximum m and sum s of exp(x - m), and exp(x_b - m) w_b into a running
    product a, both rescaled by exp(m_old - m_new) when the maximum grows; at the end
    softmax(x) w = a / s, without the logits ever whole. The gradient of the logits is
    softmax - (1 - eps) at the target - eps / K at each other word but padding, so
    d h = a / s - (1 - eps) w_y - eps / K (sum of w - w_y - w_pad), kept rows only."""
    n, V = h.size(0), w.size(0)
    K = _other_classes(V, pad_id)
    most = torch.full((n,), float("-inf"), dtype=h.dtype, device=h.device)
    total = torch.zeros(n, dtype=h.dtype, device=h.device)
    a = torch.zeros_like(h)
    x_y, x_sum, x_pad = (torch.zeros(n, dtype=h.dtype, device=h.device) for _ in range(3))
    for start in range(0, V, ROW_BLOCK):
        stop = min(start + ROW_BLOCK, V)
        w_b = w[start:stop]
        x = times_transposed(h, w_b)  # (n, words): oneDNN's product on AMD's CPUs
        here = (y >= start) & (y < stop)  # rows whose target is among these words
        x_y = torch.where(here, x.gather(1, (y - start).clamp(0, stop - start - 1)[:, None])[:, 0],
                          x_y)
        if smoothing:
            x_sum += x.sum(dim=-1)
            if pad_id is not None and start <= pad_id < stop:
                x_pad = x[:, pad_id - start].clone()
        new_most = torch.maximum(most, x.amax(dim=-1))
        rescale = (most - new_most).exp_()
        p = x.sub_(new_most[:, None]).exp_()  # in the logits' place
        total.mul_(rescale).add_(p.sum(dim=-1))
        a = a.mul_(rescale[:, None]).add_(times_transposed(p, w_b.T))
        most = new_most
    lse = most + total.log()
    nll = (lse - x_y).masked_fill(~keep, 0.0)
    grad = a.div_(total[:, None]).sub_((1.0 - smoothing) * w[y])
    if not smoothing:
        return nll.sum(), nll.sum(), grad.mul_(keep[:, None])
    others = x_sum - x_y - x_pad  # the logits of the words that get eps / K each
    rest = (K * lse - others).masked_fill(~keep, 0.0)
    spread = w.sum(dim=0) - w[y] - (0.0 if pad_id is None else w[pad_id])
    grad.sub_(smoothing / K * spread)
    return ((1.0 - smoothing) * nll + smoothing / K * rest).sum(), nll.sum(), \
        grad.mul_(keep[:, None])
