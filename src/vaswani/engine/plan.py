"""The plan of one forward pass over the engine's cache (cache.py), decided before it runs:
where each row's new keys go, which keys it reads, and for a translator which source keys.
The runner (runner.py) and the padded steps a GPU captures (graphs.py) make one; the cache's
view (views.py ``StepCache``) and the step (step.py) read it unchanged.

Shapes: R rows, T new tokens per row, G sources read when grouped.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

Parts = list[tuple[int, int, int]]  # (first row, past the last, keys read): cache.py ``parts``


@dataclass(frozen=True)
class StepPlan:
    columns: Tensor
    """(R, T): the column of each new token's keys in its row's slot."""
    width: int
    """Keys read per row (the rows' longest context)."""
    slots: Tensor | None = None
    """(R,): the rows' slots, read by index; None: slots 0 .. R-1, read in place."""
    column: int | None = None
    """Every row's one new token goes to this column (rows in step): one slice written."""
    self_parts: Parts | None = None
    """The leading slots' own keys read in parts of like contexts; None: one pass."""
    cross: int = 0
    """A translator's source keys read per row (0: a language model)."""
    sources: Tensor | None = None
    """(R,): each row's source slot, read by index; None: the leading source slots."""
    lengths: Tensor | None = None
    """Real tokens of each source read ((R,), or (G,) when grouped); None: all ``cross``
    long, read without a mask."""
    groups: tuple[Tensor, Tensor] | None = None
    """Rows that share a source read it once (cache.py ``SlotCache.groups``)."""
    parts: Parts | None = None
    """The rows' sources read in parts of rows, each over its own longest source's keys: the
    leading source slots in parts of like lengths (``SlotCache.parts``), or a compiled
    step's runs of rows (compiled.py ``SOURCE_PARTS``)."""
    apart: bool = False
    """Each row's queries attend as rows of their own, one query each, as decoding steps
    would (views.py :func:`one_query_a_row`): a speculative pass's (speculate.py)."""
