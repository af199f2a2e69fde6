"""Mixture of experts: a feed-forward block made of many feed-forward blocks ("experts"), of
which each token uses only a few (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2021;
Mixtral, Qwen3-MoE, OLMoE).

For each token x (D,) a :class:`Router` scores every expert, ``softmax(x W_r)`` (E,); the
``top_k`` highest are chosen and the token's output is their experts' outputs weighted by
those probabilities (renormalised to sum to 1 where the model asks)::

    y = sum over the chosen e of p_e * expert_e(x)

Shape: (B, T, D) -> (B, T, D), as :class:`~vaswani.nn.feedforward.FeedForward`. The model
holds E experts' weights but each token reads k of them: Qwen3-30B-A3B holds 30B parameters
and computes with 3B a token.

Each expert runs once, on the rows routed to it, in expert order (while training every
expert, on no rows if none chose it, so that each has a gradient). Where shapes must not
depend on the data (a traced, exported or compiled model, a captured CUDA graph), every
expert runs on every row instead and the unchosen get weight 0: the same sum, E / k times
the arithmetic.

Routing learns nothing that keeps the experts in use; :func:`load_balancing_loss` (the
Switch Transformer's, eq. 4-6) is the auxiliary loss that does, added to the training loss
with a small coefficient. Each block keeps its last training forward's router scores for it
(``router_logits``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class Router(nn.Module):
    """x (N, D) -> one score per expert (N, E): a linear map without bias, kept apart from
    the ``Linear`` layers (quantized weights and LoRA adapters leave it as it is: a small
    matrix whose errors would move tokens to other experts)."""

    def __init__(self, d_model: int, n_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_experts, d_model))

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight)


def static_shapes() -> bool:
    """Whether the forward is being traced, exported, compiled or captured: then a tensor's
    shape may not depend on its values. CUDA is asked last: torch.compile cannot trace
    ``is_current_stream_capturing`` (a graph break, fatal under ``fullgraph=True``, on any
    machine with a GPU)."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return True
    return capturing_cuda_graph()


def capturing_cuda_graph() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


class MixtureOfExperts(nn.Module):
    def __init__(self, router: Router, experts: list[nn.Module], *, top_k: int,
                 renormalize: bool = False) -> None:
        super().__init__()
        if not 1 <= top_k <= len(experts):
            raise ValueError(f"top_k ({top_k}) must be between 1 and the number of experts "
                             f"({len(experts)})")
        self.router, self.experts = router, nn.ModuleList(experts)
        self.top_k, self.renormalize = top_k, renormalize
        self.router_logits: Tensor | None = None  # the last training forward's (N, E)

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x (N, D) -> (router scores (N, E), the chosen experts' weights (N, k) in x's
        dtype, their indices (N, k)). The softmax is taken in float32."""
        logits = self.router(x)
        weights, chosen = F.softmax(logits, dim=-1, dtype=torch.float32).topk(self.top_k)
        if self.renormalize:
            weights = weights / weights.sum(-1, keepdim=True)
        return logits, weights.to(x.dtype), chosen

    def forward(self, x: Tensor) -> Tensor:
        flat = x.reshape(-1, x.size(-1))
        logits, weights, chosen = self.route(flat)
        training = self.training and torch.is_grad_enabled()
        self.router_logits = logits if training else None
        out = torch.zeros_like(flat)
        if static_shapes():
            gates = torch.zeros_like(logits).scatter(-1, chosen, weights)  # (N, E), k nonzero
            for e, expert in enumerate(self.experts):
                out = out + gates[:, e, None] * expert(flat)
            return out.view_as(x)
        # while training every expert runs, on no rows where none chose it: each gets its
        # gradient, zero if unused, so that processes averaging gradients agree on which exist
        for e in range(len(self.experts)) if training else chosen.unique().tolist():
            rows, place = torch.where(chosen == e)  # row, its place in the k
            out.index_add_(0, rows, self.experts[e](flat[rows]) * weights[rows, place, None])
        return out.view_as(x)


def load_balancing_loss(router_logits: list[Tensor], top_k: int,
                        keep: Tensor | None = None) -> Tensor:
    """The Switch Transformer's auxiliary loss over every MoE layer's router scores (each
    (N, E)), counting only the rows ``keep`` (N,) marks (None: all)::

        E * sum over experts e of f_e * P_e

    f_e: the share of (row, choice) pairs sent to expert e, P_e: the mean probability the
    router gives e, both over all layers' rows. It is k when routing is uniform, and grows as
    tokens crowd onto a few experts; its gradient reaches the router through P_e."""
    n_experts = router_logits[0].size(-1)
    device = router_logits[0].device
    counts = torch.zeros(n_experts, device=device)
    probs = torch.zeros(n_experts, device=device)
    weight = torch.ones(router_logits[0].size(0), device=device) if keep is None \
        else keep.reshape(-1).to(device=device, dtype=torch.float32)
    for logits in router_logits:
        p = F.softmax(logits, dim=-1, dtype=torch.float32)
        chosen = p.topk(top_k, dim=-1).indices
        counts = counts.scatter_add(0, chosen.reshape(-1), weight.repeat_interleave(top_k))
        probs = probs + (p * weight[:, None]).sum(0)
    rows = weight.sum() * len(router_logits)
    return n_experts * ((counts / rows) * (probs / rows)).sum()
