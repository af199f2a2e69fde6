"""A training step's time, taken apart: its matrix products timed alone at their shapes
(``products_alone``), and each operator timed where it runs inside the step
(``time_in_step``). ``benchmarks.finetune`` reports both for each float contender.

On a CPU an operator's call returns when its work is done, so a clock around each call
inside a step measures it there (a GPU's calls are asynchronous: not for one).
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import flop_registry, register_flop_formula

if torch.backends.mkldnn.is_available() and \
        torch.ops.mkldnn._linear_pointwise not in flop_registry:
    @register_flop_formula(torch.ops.mkldnn._linear_pointwise)
    def _onednn_linear_flop(x_shape, w_shape, *args, out_shape=None, **kwargs) -> int:
        """oneDNN's linear (vaswani's products on AMD's CPUs, cpu/linear.py) counted as
        ``FlopCounterMode`` counts ``aten.mm``: 2 x rows x in x out."""
        return 2 * torch.Size(x_shape).numel() * w_shape[0]


class _Products(TorchDispatchMode):
    """Records each matrix product a step runs (:func:`_is_product`): the operation and its
    arguments' shapes, strides and dtypes."""

    def __init__(self):
        super().__init__()
        self.calls: list[tuple] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _is_product(func):
            self.calls.append((func, tree_map(_layout, (args, kwargs))))
        return func(*args, **kwargs)


def _is_product(func) -> bool:
    """An operation FlopCounterMode counts, or its in-place form (``addmm_``, which it
    does not)."""
    in_place = getattr(torch.ops.aten, func.overloadpacket.__name__.rstrip("_"), None)
    return func.overloadpacket in flop_registry or in_place in flop_registry


def _layout(x):
    return (x.shape, x.stride(), x.dtype) if isinstance(x, torch.Tensor) else x


def products_alone(step, inputs, repeats: int = 5) -> dict:
    """Seconds that one ``step`` on ``inputs`` spends in its matrix products alone: each
    product it runs, recorded, then run by itself on fresh tensors of the same shapes, strides
    and dtypes (the best of ``repeats`` after two to warm up; a product repeated in the step
    is timed once and counted each time). A step that did nothing else, at this machine's
    speed at those shapes, would take this long: the ceiling of any step made of these
    products. Returns ``products_s`` (the sum) and ``products``, the ten costliest (operation,
    its arguments' shapes and strides, times in the step, seconds in all): where they go."""
    with _Products() as products:
        step(inputs)
    counts = Counter((func, repr(layout)) for func, layout in products.calls)
    layouts = {(func, repr(layout)): layout for func, layout in products.calls}
    alone = {}
    for key, layout in layouts.items():
        args, kwargs = tree_map(_fresh, layout, is_leaf=_is_layout)
        for _ in range(2):
            key[0](*args, **kwargs)
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            key[0](*args, **kwargs)
            best = min(best, time.perf_counter() - start)
        alone[key] = best * counts[key]
    costliest = sorted(alone, key=alone.get, reverse=True)[:10]
    return {"products_s": sum(alone.values()),
            "products": [{"op": str(func.overloadpacket), "times": counts[(func, key)],
                          "seconds": alone[(func, key)],
                          "arguments": [[list(x[0]), list(x[1])] for x in
                                        tree_leaves(layouts[(func, key)], is_leaf=_is_layout)
                                        if _is_layout(x)]}
                         for func, key in costliest]}


def _is_layout(x) -> bool:
    return isinstance(x, tuple) and len(x) == 3 and isinstance(x[0], torch.Size)


def _fresh(x):
    if not _is_layout(x):
        return x
    shape, stride, dtype = x
    fresh = torch.empty_strided(shape, stride, dtype=dtype)
    return fresh.normal_().mul_(0.1) if dtype.is_floating_point else fresh.zero_()


class _Clock(TorchDispatchMode):
    """Times each operator call (products and the rest apart) of what runs inside it."""

    def __init__(self):
        super().__init__()
        self.products = 0.0
        self.other: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        seconds = time.perf_counter() - start
        if _is_product(func):
            self.products += seconds
        else:
            name = str(func.overloadpacket)
            self.other[name] += seconds
            self.calls[name] += 1
        return out


def time_in_step(step, inputs, repeats: int = 3) -> dict:
    """One ``step`` on ``inputs`` with a clock around each operator it runs (the fastest of
    ``repeats`` steps): ``in_step_s`` (the whole step, the clocks' own cost included),
    ``in_step_products_s`` (its matrix products, where they run: beside
    :func:`products_alone`, what the step's surroundings cost them),
    ``in_step_other_s`` (every other operator) and ``in_step_other``, the ten costliest of
    those (operator, calls, seconds). What is left of the step is Python's, autograd's and
    the clocks'."""
    best = None
    for _ in range(repeats):
        with _Clock() as clock:
            start = time.perf_counter()
            step(inputs)
            wall = time.perf_counter() - start
        if best is None or wall < best[0]:
            best = (wall, clock)
    wall, clock = best
    costliest = sorted(clock.other, key=clock.other.get, reverse=True)[:10]
    return {"in_step_s": wall, "in_step_products_s": clock.products,
            "in_step_other_s": sum(clock.other.values()),
            "in_step_other": [{"op": name, "calls": clock.calls[name],
                               "seconds": clock.other[name]} for name in costliest]}
