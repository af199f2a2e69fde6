"""The optimizers, ``[train] optimizer``: AdamW for every parameter, or Muon for the layers'
weight matrices and AdamW for the rest.

Muon (Jordan et al. 2024, ``torch.optim.Muon``) keeps one momentum buffer per matrix and
replaces each update by its nearest semi-orthogonal matrix (a few Newton-Schulz iterations,
in bf16 where the device has it natively, in float32 elsewhere: :class:`Muon`): every
direction of the matrix moves by about the same amount, where Adam's update is dominated by a
few. It is made for the 2-D weights of hidden layers; the embeddings (which
are looked up, not multiplied), the output head tied to them, norms and biases keep AdamW.
So a Muon run has two optimizers, each with its own peak learning rate (``muon_lr`` and
``lr``), both following the one schedule; the split is the one the modded-nanoGPT speedrun
uses. :class:`Optimizers` steps, clears, saves and restores them together.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import Tensor, nn

from ..devices import bf16_is_fast
from ..nn.layers import Stack


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The 2-D weights of the transformer layers (attention and feed-forward projections):
    what Muon optimizes. Embeddings, heads, norms and biases live outside a layer or have
    one dimension."""
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, Stack):
            for p in module.parameters():
                if p.requires_grad and p.dim() == 2:
                    seen[id(p)] = p
    return list(seen.values())


def orthogonalize(update: Tensor, coefficients: tuple[float, float, float], steps: int,
                  eps: float, dtype: torch.dtype) -> Tensor:
    """Muon's Newton-Schulz iteration in ``dtype``: the nearest semi-orthogonal matrix to
    ``update``, roughly (its singular values end between ~0.5 and ~1.5, not at 1). The same
    quintic as ``torch.optim.Muon``, which always runs it in bf16. ``update`` is one matrix
    (m, n) or a stack of them (k, m, n), each orthogonalized on its own."""
    a, b, c = coefficients
    x = update.to(dtype)
    tall = update.size(-2) > update.size(-1)
    if tall:  # iterate on the smaller Gram matrix
        x = x.mT
    if x.dim() == 2:
        x = x / x.norm().clamp(min=eps)  # spectral norm <= 1
        multiply_add = torch.addmm  # beta * first + alpha * (second @ third)
    else:
        x = x / x.norm(dim=(-2, -1), keepdim=True).clamp(min=eps)
        multiply_add = torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        x = multiply_add(x, multiply_add(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def orthogonalize_all(updates: list[Tensor], coefficients: tuple[float, float, float],
                      steps: int, eps: float, dtype: torch.dtype) -> list[Tensor]:
    """:func:`orthogonalize` for each of ``updates``, those of one shape stacked and done at
    once: a model's layers repeat a few shapes, and a product of small matrices costs mostly
    its call (docs/performance.md, "Muon's orthogonalization"). Sharded matrices (DTensor) go
    one by one."""
    out: list[Tensor | None] = [None] * len(updates)
    stacks: dict[tuple, list[int]] = {}
    for i, u in enumerate(updates):
        if type(u) is Tensor:
            stacks.setdefault((u.shape, u.device, u.dtype), []).append(i)
        else:
            out[i] = orthogonalize(u, coefficients, steps, eps, dtype)
    for indices in stacks.values():
        if len(indices) == 1:
            done = [orthogonalize(updates[indices[0]], coefficients, steps, eps, dtype)]
        else:
            done = orthogonalize(torch.stack([updates[i] for i in indices]), coefficients,
                                 steps, eps, dtype).unbind()
        for i, x in zip(indices, done, strict=True):
            out[i] = x
    return out


class Muon(torch.optim.Muon):
    """``torch.optim.Muon``, with its Newton-Schulz iteration in ``ortho_dtype``.

    PyTorch runs the iteration in bf16, fast on GPUs and on CPUs with AVX512-BF16 or AMX.
    Elsewhere PyTorch emulates bf16 matrix products, and the iteration becomes most of a step
    (docs/performance.md, "Muon's orthogonalization"). The step below is
    PyTorch's (momentum, Nesterov, decoupled weight decay, the rate scaled by
    sqrt(max(1, rows / columns))), as is the state: one ``momentum_buffer`` per matrix. One
    difference: the matrices of one shape are orthogonalized stacked (:func:`orthogonalize_all`),
    where PyTorch goes one by one; in bf16 that equals PyTorch's step to the bit for matrices of
    distinct shapes, and to within bf16 rounding for stacked ones
    (``tests/training/test_optimizers.py``). The step holds all of its updates at
    once (one more copy of the matrices) where PyTorch holds one."""

    def __init__(self, params, *, ortho_dtype: torch.dtype = torch.bfloat16, **options) -> None:
        if options.get("adjust_lr_fn") not in (None, "original"):
            raise ValueError("only Muon's original learning-rate scaling is supported")
        super().__init__(params, **options)
        self.ortho_dtype = ortho_dtype

    @torch.no_grad()
    def step(self, closure=None, finite: Tensor | None = None):
        """One update; with ``finite`` (a 0-dim bool tensor on the device) none where it is
        false, decided on the device: no step waits to read it on the host. A skipped step's
        gradient is replaced by the momentum buffer (a blend of the buffer with itself leaves
        it as it was) and its update is scaled by 0."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, buffers = [], [], []
            self._init_group(group, params, grads, buffers)
            lr, momentum, decay = group["lr"], group["momentum"], group["weight_decay"]
            updates = []
            for grad, buffer in zip(grads, buffers, strict=True):
                if finite is not None:
                    grad = torch.where(finite, grad, buffer)
                buffer.lerp_(grad, 1 - momentum)
                updates.append(grad.lerp(buffer, momentum) if group["nesterov"] else buffer)
            updates = orthogonalize_all(updates, group["ns_coefficients"], group["ns_steps"],
                                        group["eps"], self.ortho_dtype)
            for p, update in zip(params, updates, strict=True):
                rate = -lr * math.sqrt(max(1, p.size(0) / p.size(1)))
                if finite is None:
                    p.mul_(1 - lr * decay)
                    p.add_(update, alpha=rate)
                else:
                    p.mul_(torch.where(finite, 1 - lr * decay, 1.0).to(p.dtype))
                    p.add_(update * finite.to(update.dtype), alpha=rate)
        return loss


def adamw(params: list[nn.Parameter], cfg) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on norms, biases).

    ``fused=True``: one kernel per parameter updates it in place, where the default
    (``foreach``) makes several temporary copies of every parameter per step."""
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    fused = all(p.device.type in ("cpu", "cuda") and p.is_floating_point() for p in params)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


class Optimizers:
    """The run's optimizers, by name (``adamw``, and ``muon`` when asked for), each with its
    peak learning rate; stepped, cleared, saved and restored as one. Iterating gives the
    torch optimizers themselves (for a gradient scaler, or DCP's sharded state)."""

    def __init__(self, parts: dict[str, tuple[torch.optim.Optimizer, float]]) -> None:
        self.parts = parts

    def __iter__(self) -> Iterator[torch.optim.Optimizer]:
        return (opt for opt, _ in self.parts.values())

    @property
    def state(self) -> dict:
        """Every parameter's optimizer state (its moments, or its momentum buffer)."""
        return {p: s for opt in self for p, s in opt.state.items()}

    def set_lr(self, factor: float) -> None:
        """This step's rates: each optimizer's peak rate times the schedule's ``factor``."""
        for opt, peak in self.parts.values():
            for group in opt.param_groups:
                group["lr"] = peak * factor

    def step(self, finite: Tensor | None = None) -> None:
        """Update, unless ``finite`` (a bool tensor on the device) is false. Fused AdamW
        decides on the device: it takes the flag a gradient scaler would hand it
        (``found_inf``) and then leaves its weights, moments and step count alone; Muon
        takes the flag itself (:meth:`Muon.step`). Another optimizer reads it on the host."""
        for opt in self:
            if finite is None:
                opt.step()
            elif opt.defaults.get("fused"):
                opt.found_inf = (~finite).float()
                opt.step()
                del opt.found_inf
            elif isinstance(opt, Muon):
                opt.step(finite=finite)
            elif bool(finite):
                opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self:
            opt.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        """AdamW alone: its own state dict (the format every run has written); with Muon,
        ``{"muon": ..., "adamw": ...}``."""
        if list(self.parts) == ["adamw"]:
            return self.parts["adamw"][0].state_dict()
        return {name: opt.state_dict() for name, (opt, _) in self.parts.items()}

    def load_state_dict(self, saved: dict, model: nn.Module, where: Path) -> None:
        """Load what :meth:`state_dict` gave, after checking that it fits (see
        :func:`check_state`); an AdamW state into a Muon run (or back) is refused."""
        single = "param_groups" in saved
        saved_parts = {"adamw": saved} if single else saved
        if set(saved_parts) != set(self.parts):
            raise ValueError(f"{where}: the saved optimizer state is for "
                             f"{' + '.join(sorted(saved_parts))}, this run's [train] optimizer "
                             f"uses {' + '.join(sorted(self.parts))}; resume with the "
                             "optimizer the run was trained with")
        for name, (opt, _) in self.parts.items():
            check_state(opt, saved_parts[name], model, where)
            opt.load_state_dict(saved_parts[name])


def make_optimizer(model: nn.Module, cfg) -> Optimizers:
    """The optimizers ``[train] optimizer`` names, over the trainable parameters."""
    params = [p for p in model.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        return Optimizers({"adamw": (adamw(params, cfg), cfg.lr)})
    matrices = hidden_matrices(model)
    ids = {id(p) for p in matrices}
    fast = not matrices or bf16_is_fast(matrices[0].device)
    muon = Muon(matrices, lr=cfg.muon_lr, weight_decay=cfg.weight_decay,
                momentum=cfg.muon_momentum,
                ortho_dtype=torch.bfloat16 if fast else torch.float32)
    rest = [p for p in params if id(p) not in ids]
    return Optimizers({"muon": (muon, cfg.muon_lr), "adamw": (adamw(rest, cfg), cfg.lr)})


def check_state(optimizer: torch.optim.Optimizer, saved: dict, model: nn.Module,
                where: Path) -> None:
    """A saved optimizer state must fit the parameters it is loaded into. PyTorch matches them
    by position only, and the fused AdamW kernel does not check shapes: a mismatch (a model
    changed between save and load) would corrupt memory instead of failing."""
    names = {id(p): name for name, p in model.named_parameters()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    indices = [i for group in saved["param_groups"] for i in group["params"]]
    if len(indices) != len(params):
        raise ValueError(f"{where}: the saved optimizer state holds {len(indices)} parameters "
                         f"but the model has {len(params)}; it belongs to another model")
    for i, p in zip(indices, params, strict=True):
        for key, value in saved["state"].get(i, {}).items():
            if isinstance(value, torch.Tensor) and value.dim() and value.shape != p.shape:
                raise ValueError(f"{where}: the saved optimizer state's {key} for "
                                 f"{names.get(id(p), i)} has shape {tuple(value.shape)}, the "
                                 f"parameter {tuple(p.shape)}; it belongs to another model")
