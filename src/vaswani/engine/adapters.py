"""Several LoRA adapters over one base model, each request choosing its own.

A LoRA run (nn/lora.py) changes a few of its base model's linear layers by a low-rank update.
Serving several such runs of one base as merged models would hold the base's weights once per
run; here the base is held once, and each adapted layer becomes an :class:`AdapterBank`: the
base layer and every adapter's update for it, adapter ``k`` (1, 2, ...) being the ``k``-th
run's, and 0 the base alone. Each row of a batch is computed with its own request's adapter,
so requests for different adapters share the engine's batches, as requests for one model do.

Which adapter each row uses is a :class:`Choice` that all the banks of a model share: the
runner (runner.py) chooses every row's before each forward pass and lets go after it, and a
direct use of the model (scoring a text, the attention explorer) chooses one adapter for the
whole batch. A bank used with no choice made is an error, not the base's output: a row must
never get another adapter's answer, or none, by accident.

A row of adapter ``k`` computes exactly what the unmerged LoRA model (nn/lora.py ``LoRA``)
computes where the whole batch is ``k``'s; where rows of several adapters share the batch,
each adapter's rows are taken out and computed together (``index_select``), added back with
``index_copy``.
"""

from __future__ import annotations

import contextlib

import torch
from torch import Tensor, nn

from ..nn.lora import LoRA
from .tensors import tensor_of


class Choice:
    """The adapter of each row of the forward pass under way (0: the base alone)."""

    def __init__(self) -> None:
        self.rows: int | None = None  # rows of the pass (None: any number, all one adapter)
        self.groups: list[tuple[int, Tensor | None]] | None = None  # None: nothing chosen

    @contextlib.contextmanager
    def __call__(self, adapters: list[int] | int, device: torch.device | None = None):
        """Within the block, row ``i`` uses adapter ``adapters[i]`` (an int: every row uses
        that one); ``device``: the rows' (for the index tensors)."""
        if self.groups is not None:
            raise RuntimeError("an adapter choice is already made for the pass under way")
        if isinstance(adapters, int):
            self.rows, self.groups = None, [(adapters, None)]
        else:
            self.rows, used = len(adapters), sorted(set(adapters))
            self.groups = [(used[0], None)] if len(used) == 1 else [
                (k, tensor_of([i for i, a in enumerate(adapters) if a == k], device))
                for k in used]
        try:
            yield
        finally:
            self.rows = self.groups = None

    def chosen(self, rows: int) -> list[tuple[int, Tensor | None]]:
        """Each adapter used with the rows that use it (None: all ``rows`` of them)."""
        if self.groups is None:
            raise RuntimeError("this model serves several LoRA adapters and no adapter was "
                               "chosen for its rows (engine/adapters.py)")
        if self.rows is not None and self.rows != rows:
            raise RuntimeError(f"adapters were chosen for {self.rows} rows; the pass has "
                               f"{rows}")
        return self.groups


class AdapterBank(nn.Module):
    """A base linear layer and the LoRA updates of several adapters for it (``loras[k - 1]``:
    adapter ``k``'s, None where that adapter leaves this layer as it is); each row computed
    with the adapter ``choice`` gives it."""

    def __init__(self, base: nn.Module, loras: list[LoRA | None], choice: Choice) -> None:
        super().__init__()
        self.base, self.choice = base, choice
        self.loras = nn.ModuleList([nn.Identity() if lora is None else lora for lora in loras])
        for lora in loras:
            if lora is not None:
                lora.base = None  # the base is held here, once, not inside each adapter
        self.in_features, self.out_features = base.in_features, base.out_features

    def forward(self, x: Tensor) -> Tensor:
        return self.rows(x, 0, self.out_features)

    def rows(self, x: Tensor, start: int, stop: int) -> Tensor:
        """Output rows ``start:stop`` of each batch row (dimension 0 of ``x``), with its
        adapter's updates added."""
        whole = (start, stop) == (0, self.out_features)
        y = self.base(x) if whole else self.base.rows(x, start, stop)
        for k, rows in self.choice.chosen(x.shape[0]):
            lora = self.loras[k - 1] if k else None
            if not isinstance(lora, LoRA):
                continue  # the base alone
            if rows is None:
                y = lora.added(x, y, start, stop)
            else:
                y = y.index_copy(0, rows, lora.added(x.index_select(0, rows),
                                                     y.index_select(0, rows), start, stop))
        return y


def attach(model: nn.Module, adapters: list[dict[str, LoRA]]) -> Choice:
    """Every layer of ``model`` that one of ``adapters`` adapts (each as nn/lora.py
    ``remove_lora`` gives it: {layer name: its LoRA layer}) replaced by an
    :class:`AdapterBank` holding the base layer once and each adapter's update, in place;
    returns the :class:`Choice` that says which adapter each row uses."""
    choice = Choice()
    names = sorted({name for taken in adapters for name in taken})
    for name in names:
        parent, _, attribute = name.rpartition(".")
        owner = model.get_submodule(parent)
        bank = AdapterBank(getattr(owner, attribute), [taken.get(name) for taken in adapters],
                           choice)
        setattr(owner, attribute, bank)
    model.adapter_choice = choice
    return choice


def choice_of(model: nn.Module) -> Choice | None:
    """The :class:`Choice` of a model that serves several adapters (:func:`attach`), or
    None."""
    return getattr(model, "adapter_choice", None)


def choose(model: nn.Module, adapters: list[int] | int, device: torch.device | None = None):
    """A context in which ``model``'s rows use ``adapters`` (:class:`Choice`); nothing to
    choose for a model without adapters."""
    choice = choice_of(model)
    return contextlib.nullcontext() if choice is None else choice(adapters, device)
