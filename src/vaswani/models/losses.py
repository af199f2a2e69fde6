"""Cross-entropy with label smoothing that respects padding.

With smoothing ``eps`` over a vocabulary of V classes, the target distribution puts ``1 - eps``
on the true class and spreads ``eps`` evenly over the other V - 2 classes that are neither the
true class nor padding (as in the Annotated Transformer); padding positions contribute nothing
and are not counted. The unsmoothed negative log-likelihood is returned beside it, because
perplexity must come from the NLL, not from the smoothed loss.

``torch.nn.functional.cross_entropy(label_smoothing=eps)`` differs: it spreads eps/V over
*all* classes, padding included.

:func:`reference_smoothed_cross_entropy` writes the loss out with ``log_softmax``.
:func:`smoothed_cross_entropy`, used for training, computes the same numbers without ever
holding fp32 copies of the whole (N, V) logits: it works through the rows in chunks, keeps
only each row's log-sum-exp, and in the backward pass recomputes each chunk's softmax and
writes the gradient straight in the logits' dtype, ``softmax - target distribution``. With
bf16 logits over an 8000-word vocabulary that removes four (N, V) fp32 tensors per step (the
upcast, log-probabilities, and two gradient buffers). On a GPU there is no chunk loop: a
loop of small kernels is bound by their launches, so :func:`smoothed_cross_entropy`
computes the same numbers there in a log-softmax, a row sum and PyTorch's log-softmax
backward (:func:`fused_smoothed_cross_entropy`: fewer passes over the logits than
``F.cross_entropy`` with label smoothing makes). A compiled
training step uses :func:`compiled_smoothed_cross_entropy`, the reference compiled: inductor
fuses its upcast, log-softmax, sums and gathers into a pass or two over the logits, and the
backward into one (on a GPU faster than ``F.cross_entropy`` itself: docs/performance.md).
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor, nn

from ..nn.moe import MixtureOfExperts, load_balancing_loss


def reference_smoothed_cross_entropy(logits: Tensor, target: Tensor, *, smoothing: float = 0.0,
                                     pad_id: int | None = None
                                     ) -> tuple[Tensor, Tensor, Tensor]:
    """logits (N, V), target (N,) -> (smoothed loss sum, NLL sum, number of counted targets).

    Sums, not means: the caller divides by the token count of the whole optimizer step
    (all micro-batches, all ranks), which is what makes gradient accumulation and DDP exact.
    """
    # bf16/fp16 logits are upcast for the softmax; float64 stays float64.
    logp = logits.log_softmax(dim=-1, dtype=torch.promote_types(logits.dtype, torch.float32))
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    nll = -logp.gather(1, target[:, None]).squeeze(1)  # (N,)
    nll = nll.masked_fill(~keep, 0.0)
    count = keep.sum()
    if smoothing == 0.0:
        return nll.sum(), nll.sum(), count
    V = logits.size(-1)
    others = V - 1 - (0 if pad_id is None else 1)  # classes that share eps
    total = logp.sum(dim=-1)
    if pad_id is not None:
        total = total - logp[:, pad_id]
    rest = -(total + nll)  # -sum of log p over non-target, non-pad classes (nll = -log p_y)
    loss = (1.0 - smoothing) * nll + smoothing / others * rest
    loss = loss.masked_fill(~keep, 0.0)
    return loss.sum(), nll.sum(), count


def smoothed_cross_entropy(logits: Tensor, target: Tensor, *, smoothing: float = 0.0,
                           pad_id: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Same inputs and results as :func:`reference_smoothed_cross_entropy`: on a CPU computed
    in row chunks, elsewhere with PyTorch's fused kernel (see the module docstring). Returns
    (smoothed loss sum, NLL sum, count)."""
    if logits.device.type != "cpu":
        return fused_smoothed_cross_entropy(logits, target, smoothing=smoothing, pad_id=pad_id)
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    loss, nll = _ChunkedSmoothedCE.apply(logits, target, keep, smoothing, pad_id)
    return loss, nll, keep.sum()


def compiled_smoothed_cross_entropy(logits: Tensor, target: Tensor, *, smoothing: float = 0.0,
                                    pad_id: int | None = None
                                    ) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`reference_smoothed_cross_entropy` compiled once per process, for any number of
    rows (a batch's token count varies): what a compiled training step computes its loss
    with (``[train] compile``)."""
    return _compiled_reference()(logits, target, smoothing=smoothing, pad_id=pad_id)


@functools.cache
def _compiled_reference():
    return torch.compile(reference_smoothed_cross_entropy, dynamic=True)


def fused_smoothed_cross_entropy(logits: Tensor, target: Tensor, *, smoothing: float = 0.0,
                                 pad_id: int | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`reference_smoothed_cross_entropy`'s numbers in as few passes over the logits as
    ``F.cross_entropy`` makes, for a device where a loop of small kernels costs their
    launches (:class:`_SmoothedCEFromLogSoftmax`). Returns (smoothed loss sum, NLL sum,
    count)."""
    keep = torch.ones_like(target, dtype=torch.bool) if pad_id is None else target != pad_id
    loss, nll = _SmoothedCEFromLogSoftmax.apply(logits, target, keep, smoothing, pad_id)
    return loss, nll, keep.sum()


class _SmoothedCEFromLogSoftmax(torch.autograd.Function):
    """Forward: one log-softmax (the logits read once, written once in float32) and, with
    smoothing, a row sum of it; the rest are (N,) vectors and two gathers. Backward: the
    gradient with respect to the log-probabilities, G, is a constant per row (-eps / K times
    the loss's gradient on the K other classes, 0 on padding's column and on padded rows)
    except in the target's column; G is written once and PyTorch's own log-softmax backward
    turns it into the logits' gradient in one pass, in their dtype. What ``F.cross_entropy``
    with label smoothing moves, on logits upcast as autocast upcasts them, is more: the upcast,
    the log-softmax, the smoothing's sum, and in the backward a dense NLL gradient, the
    smoothing's, their sum, the log-softmax backward and the downcast
    (``tests/models/test_losses.py`` counts the bytes)."""

    @staticmethod
    def forward(ctx, logits, target, keep, smoothing, pad_id):
        acc = torch.promote_types(logits.dtype, torch.float32)  # bf16 -> fp32, fp64 stays
        logp = torch.log_softmax(logits, dim=-1, dtype=acc)  # (N, V)
        logp_y = logp.gather(1, target[:, None]).squeeze(1)  # (N,)
        nll = (-logp_y).masked_fill(~keep, 0.0)
        if smoothing:
            K = _other_classes(logits.size(-1), pad_id)
            others = logp.sum(dim=-1) - logp_y  # sum of log p over the non-target classes
            if pad_id is not None:
                others = others - logp[:, pad_id]
            loss = ((1.0 - smoothing) * nll - smoothing / K * others.masked_fill(~keep, 0.0))
        else:
            loss = nll
        ctx.save_for_backward(logp, target, keep)
        ctx.smoothing, ctx.pad_id, ctx.dtype = smoothing, pad_id, logits.dtype
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        logp, target, keep = ctx.saved_tensors
        eps, pad_id = ctx.smoothing, ctx.pad_id
        K = _other_classes(logp.size(-1), pad_id)
        kept = keep.to(logp.dtype)
        spread = (g_loss * eps / K).to(logp.dtype) * kept  # (N,): each other class's -G
        on_target = (g_loss * (1.0 - eps) + g_nll).to(logp.dtype) * kept
        grad = torch.empty_like(logp).copy_(-spread[:, None])  # G, dL/dlog p: (N, V)
        if pad_id is not None:
            grad[:, pad_id] = 0.0  # padding gets no smoothing mass
        grad.scatter_(1, target[:, None], -on_target[:, None])
        if _mixed_backward(logp.device, ctx.dtype):
            grad = torch.ops.aten._log_softmax_backward_data(grad, logp, 1, ctx.dtype)
        else:  # in logp's dtype, then the logits' (one more pass where the two differ)
            grad = torch.ops.aten._log_softmax_backward_data(grad, logp, 1, logp.dtype)
            grad = grad.to(ctx.dtype)
        return grad, None, None, None, None


def _mixed_backward(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether ATen's log-softmax backward on ``device`` takes float32 gradients and
    log-probabilities for logits of ``dtype`` and writes the logits' dtype in the same pass:
    the CPU's kernel does for any dtype, CUDA's for float16 only (bfloat16 raises "expected
    input and grad types to match"; an H200, PyTorch 2.11)."""
    return device.type == "cpu" or dtype == torch.float16


def _other_classes(V: int, pad_id: int | None) -> int:
    """Classes that share the smoothing mass: all but the target (and padding)."""
    return V - 1 - (0 if pad_id is None else 1)


class _ChunkedSmoothedCE(torch.autograd.Function):
    """loss_i = (1 - eps) * nll_i + eps / K * sum over the K other classes c of -log p_ic,
    with -log p_ic = lse_i - x_ic, so the sum is K * lse_i - (sum_c x_ic - x_iy [- x_i,pad]).
    Gradient w.r.t. x_i: g_loss * (p_i - q_i) + g_nll * (p_i - onehot_i), q_i the smoothed
    target distribution. Rows whose target is padding contribute nothing."""

    @staticmethod
    def forward(ctx, logits, target, keep, smoothing, pad_id):
        N, V = logits.shape
        acc = torch.promote_types(logits.dtype, torch.float32)  # bf16 -> fp32, fp64 stays
        lse = torch.empty(N, dtype=acc, device=logits.device)
        loss_sum = torch.zeros((), dtype=acc, device=logits.device)
        nll_sum = torch.zeros((), dtype=acc, device=logits.device)
        for rows in _chunks(N, V, logits.device):
            x, y, k = logits[rows].to(acc), target[rows], keep[rows]
            lse[rows] = row_lse = torch.logsumexp(x, dim=-1)
            nll, loss = _chunk_sums(x, row_lse, y, k, smoothing, pad_id)
            # sums by new tensors, not in place: under torch.compile with torch 2.11 an output
            # added to in place got no gradient (the loss's was zero; 2.13 is right)
            nll_sum, loss_sum = nll_sum + nll, loss_sum + loss
        ctx.save_for_backward(logits, target, keep, lse)
        ctx.smoothing, ctx.pad_id = smoothing, pad_id
        return loss_sum, nll_sum

    @staticmethod
    def backward(ctx, g_loss, g_nll):
        logits, target, keep, lse = ctx.saved_tensors
        eps, pad_id = ctx.smoothing, ctx.pad_id
        N, V = logits.shape
        K = _other_classes(V, pad_id)
        grad = torch.empty_like(logits)
        g_loss, g_nll = g_loss.to(lse.dtype), g_nll.to(lse.dtype)
        on_target = g_loss * (1.0 - eps) + g_nll  # weight of -onehot
        spread = g_loss * eps / K  # weight of the uniform part on the K other classes
        for rows in _chunks(N, V, logits.device):
            p = (logits[rows].to(lse.dtype) - lse[rows, None]).exp_()  # softmax
            g = p.mul_(g_loss + g_nll)
            if eps:
                g -= spread
                if pad_id is not None:
                    g[:, pad_id] += spread  # padding gets no smoothing mass
            y = target[rows, None]
            g.scatter_add_(1, y, (spread - on_target).expand(y.shape).clone())
            g.mul_(keep[rows, None])
            grad[rows] = g
        return grad, None, None, None, None


def _chunk_sums(x: Tensor, lse: Tensor, y: Tensor, keep: Tensor, smoothing: float,
                pad_id: int | None) -> tuple[Tensor, Tensor]:
    """(NLL sum, smoothed loss sum) of a chunk of rows: logits ``x`` (n, V) in the
    accumulating dtype, their log-sum-exp ``lse`` (n,), targets ``y`` (n,), ``keep`` (n,)."""
    x_y = x.gather(1, y[:, None]).squeeze(1)
    nll = (lse - x_y).masked_fill(~keep, 0.0)
    if not smoothing:
        return nll.sum(), nll.sum()
    K = _other_classes(x.size(-1), pad_id)
    others = x.sum(dim=-1) - x_y - (0.0 if pad_id is None else x[:, pad_id])
    rest = (K * lse - others).masked_fill(~keep, 0.0)
    return nll.sum(), ((1.0 - smoothing) * nll + smoothing / K * rest).sum()


CHUNK_ELEMENTS = 1 << 20  # logits per chunk on a CPU: 4 MiB in fp32, reused from cache


def _chunks(N: int, V: int, device: torch.device, elements: int = CHUNK_ELEMENTS):
    """Row slices of about ``elements`` logits each, of equal size (16,384 x 32,000 logits:
    512 chunks of 32 rows; 512 x 49,152 in chunks of 4 Mi: six of 86 rows, not six of 85 and
    a seventh of 2, whose product by the head would read all its weights for two rows)."""
    count = max(1, round(N / max(1, elements // max(V, 1))))
    step = max(1, -(-N // count))
    return (slice(start, min(start + step, N)) for start in range(0, N, step))


def router_loss(model: nn.Module, keep: Tensor | None = None) -> Tensor | None:
    """The load-balancing loss (nn/moe.py ``load_balancing_loss``) of the router scores that
    ``model``'s mixture-of-experts blocks kept from its last training forward, over the rows
    ``keep`` (B, T) marks; None where it has none."""
    blocks = [m for m in model.modules()
              if isinstance(m, MixtureOfExperts) and m.router_logits is not None]
    if not blocks:
        return None
    return load_balancing_loss([b.router_logits for b in blocks], blocks[0].top_k, keep)
