"""The engine's slot cache on its own: rows keep their keys and values through compaction,
forks and widening, and a decode step reads the leading slots in place."""

import torch

from tests.conftest import DEVICE
from vaswani.engine.cache import ALIGN, SlotCache
from vaswani.engine.request import Sequence


def cache(**kw):
    return SlotCache(2, 2, 4, **{"tokens": 8 * 64, "max_rows": 8, "max_len": 40,
                                 "seq2seq": True, "dtype": torch.float32, "device": DEVICE,
                                 **kw})


def filled(c, n, length=5):
    """n rows whose keys, values and source keys are their row number + 1 (layer 1: 10x)."""
    rows = []
    for i in range(n):
        row = Sequence([0] * length)
        row.cached = length
        c.take(row, source=3)
        for layer in range(c.n_layers):
            for t in (c.k, c.v, c.ck, c.cv):
                t[layer][row.slot, :, :length] = (i + 1) * 10 ** layer
        rows.append(row)
    return rows


def assert_holds(c, row, value, length=5):
    for layer in range(c.n_layers):
        for t in (c.k, c.v):
            assert torch.all(t[layer][row.slot, :, :length] == value * 10 ** layer)
        for t in (c.ck, c.cv):
            assert torch.all(t[layer][row.slot, :, :3] == value * 10 ** layer)


def test_compaction_moves_the_last_rows_into_the_holes_with_their_keys():
    c = cache()
    rows = filled(c, 5)
    c.free(rows[1])
    c.free(rows[3])
    c.compact()
    assert c.used == 3 and [o.slot for o in c.owners] == [0, 1, 2]
    assert rows[4].slot == 1 and c.sources == [3, 3, 3]  # the last row filled the first hole
    for i in (0, 2, 4):
        assert_holds(c, rows[i], i + 1)


def test_a_fork_copies_the_parents_keys_but_not_past_the_length():
    c = cache()
    rows = filled(c, 3)
    c.fork([2], [0], length=4)
    for layer in range(c.n_layers):
        assert torch.all(c.k[layer][2, :, :4] == 10 ** layer)
        assert torch.all(c.k[layer][2, :, 4] == 3 * 10 ** layer)  # past the length: its own
    assert_holds(c, rows[0], 1)


def test_widening_keeps_every_rows_keys_and_holds_fewer_slots():
    c = cache(tokens=8 * 32)  # 8 rows of 16 + 16 at first
    assert (c.width, c.cross_width) == (16, 16) and c.rows == 8
    rows = filled(c, 3)
    c.resize(3 * ALIGN, 16)
    assert c.width == 48 and c.rows == 4
    for i, row in enumerate(rows):
        assert_holds(c, row, i + 1)


def test_a_decode_step_reads_the_leading_slots_in_place_and_a_prefill_by_index():
    c = cache()
    filled(c, 3)
    step = c.step(None, torch.zeros(3, 1, dtype=torch.long, device=DEVICE), width=5,
                  cross_width=3)
    own, cross = step.layers[0]
    assert own.k.data_ptr() == c.k[0].data_ptr()  # a view: no copy
    assert own.k.shape == (3, 2, 5, 4) and cross.k.shape == (3, 2, 3, 4)
    picked = c.step(torch.tensor([2, 0], device=DEVICE),
                    torch.zeros(2, 1, dtype=torch.long, device=DEVICE), width=5)
    k = picked.layers[1][0].k
    assert torch.all(k[0] == 30) and torch.all(k[1] == 10)
