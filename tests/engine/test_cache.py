"""The engine's slot cache on its own: rows keep their keys and values, and requests their
sources, through compaction, forks and widening; a decode step reads the leading slots in
place, and rows that share a source attend over one copy of it."""

import pytest
import torch
import torch.nn.functional as F

from tests.conftest import DEVICE
from vaswani.engine import cache as cache_module
from vaswani.engine.cache import ALIGN, PART, SlotCache, parts
from vaswani.engine.plan import StepPlan
from vaswani.engine.request import Params, Request, Sequence
from vaswani.engine.views import flat_index


def cache(**kw):
    return SlotCache(2, 2, 4, **{"tokens": 8 * 64, "max_rows": 8, "max_len": 40,
                                 "seq2seq": True, "dtype": torch.float32, "device": DEVICE,
                                 **kw})


def request():
    return Request([5, 6, 7], Params(max_new_tokens=4), start=[1])


def filled(c, n, length=5):
    """n rows, each of its own request, whose keys, values and source keys are their row
    number + 1 (layer 1: 10x)."""
    rows = []
    for i in range(n):
        row, owner = Sequence([0] * length), request()
        row.cached = length
        c.take(row, owner)
        c.take_source(owner, 3)
        for layer in range(c.n_layers):
            for t in (c.k, c.v):
                t[layer][row.slot, :, :length] = (i + 1) * 10 ** layer
            for t in (c.ck, c.cv):
                t[layer][owner.source_slot, :, :3] = (i + 1) * 10 ** layer
        rows.append(row)
    return rows


def assert_holds(c, row, value, length=5):
    for layer in range(c.n_layers):
        for t in (c.k, c.v):
            assert torch.all(t[layer][row.slot, :, :length] == value * 10 ** layer)
        for t in (c.ck, c.cv):
            source = c.requests[row.slot].source_slot
            assert torch.all(t[layer][source, :, :3] == value * 10 ** layer)


def test_an_idle_cache_restarts_with_the_slots_a_run_reserved():
    """An offline run reserves its slots, then the idle cache restarts to its initial
    widths (the run before widened them): it keeps the reservation and makes its tensors
    once with that many slots. It used to drop it and double from one slot up again (nine
    remakes zeroed, 0.2-0.45 s of a 300-verse translation after a beam search)."""
    c = cache()
    rows = filled(c, 3)
    c.resize(c.max_width, c.max_cross)  # a run's rows widened the slots
    for row in rows:
        c.free_source(c.requests[row.slot])
        c.free(row)
    c.compact()
    c.release()
    c.reserve(4)
    before = c.resizes
    assert not c.at_start
    c.restart()
    assert (c.width, c.cross_width) == c.initial and c.allocated == 4
    assert c.resizes == before + 1 and c.at_start
    filled(c, 4)
    assert c.resizes == before + 1  # the run's four slots without another remake


def test_an_offline_run_makes_its_slots_no_wider_than_its_rows_can_grow():
    """Given the longest context and source its rows can reach, an idle cache makes its
    slots that wide (here 16 and 16 of the initial 32 and 32: half the memory to zero),
    restarts to them while the run holds them, keeps wider tensors that hold as many slots
    (no remake), never starts wider than its initial widths, and after the run goes back to
    those."""
    c = cache()
    assert c.initial == (32, 32)
    c.reserve(4, context=10, source=7)
    assert (c.width, c.cross_width, c.allocated) == (16, 16, 4) and c.at_start
    before = c.resizes
    c.restart()  # the first step of the run, idle: the reserved widths stay
    assert (c.width, c.cross_width) == (16, 16) and c.resizes == before + 1
    rows = filled(c, 4)
    assert c.resizes == before + 1
    for row in rows:
        c.free_source(c.requests[row.slot])
        c.free(row)
    c.compact()
    c.release()
    assert not c.at_start
    c.restart()
    assert (c.width, c.cross_width) == c.initial
    assert c.allocated == 1 and c.resizes == before + 2
    c.reserve(1, context=10, source=7)  # wider tensors of enough slots: kept
    assert (c.width, c.cross_width) == c.initial and c.resizes == before + 2 and c.at_start
    c.release()
    c.reserve(2, context=10, source=7)  # too few slots: made anew, at the widths needed
    assert (c.width, c.cross_width, c.allocated) == (16, 16, 2) and c.resizes == before + 3
    c.release()
    c.reserve(2, context=100, source=100)  # past the initial widths: those (rows widen later)
    assert (c.width, c.cross_width) == c.initial and c.resizes == before + 4


def test_compacting_without_holes_reads_no_slot():
    """Every slot taken and every step compacts; with no slot let go since the last time
    (as many held as listed) it moves nothing and reads none of the slots."""

    class Unread(list):
        def __getitem__(self, i):
            raise AssertionError(f"slot {i} was read")

    c = cache()
    filled(c, 3)
    c.owners, c.holders = Unread(c.owners), Unread(c.holders)
    c.compact()
    assert c.used == c.sources_used == len(c.owners) == 3


def test_compaction_moves_the_last_rows_and_sources_into_the_holes_with_their_keys():
    c = cache()
    rows = filled(c, 5)
    for i in (1, 3):
        c.free_source(c.requests[rows[i].slot])
        c.free(rows[i])
    c.compact()
    assert c.used == c.sources_used == 3 and [o.slot for o in c.owners] == [0, 1, 2]
    assert rows[4].slot == 1  # the last row filled the first hole, and its source too
    assert [r.source_slot for r in c.holders] == [0, 1, 2] and c.lengths == [3, 3, 3]
    assert c.requests[1].source_slot == 1
    for i in (0, 2, 4):
        assert_holds(c, rows[i], i + 1)


def test_a_fork_copies_the_parents_keys_but_not_past_the_length():
    c = cache()
    rows = filled(c, 3)
    c.fork([(2, 0, 0, 4)])
    for layer in range(c.n_layers):
        assert torch.all(c.k[layer][2, :, :4] == 10 ** layer)
        assert torch.all(c.k[layer][2, :, 4] == 3 * 10 ** layer)  # past the length: its own
        assert torch.all(c.ck[layer][2, :, :3] == 3 * 10 ** layer)  # sources never copied
    assert_holds(c, rows[0], 1)


def test_a_fork_that_holds_a_prefix_already_copies_from_its_start_only():
    c = cache()
    filled(c, 3, length=30)
    c.fork([(2, 0, 9, 30), (1, 0, 0, 0)])  # a fork of no keys: no copy
    for layer in range(c.n_layers):
        for t in (c.k, c.v):
            k = t[layer]
            assert torch.all(k[2, :, :9] == 3 * 10 ** layer)  # held: not copied
            assert torch.all(k[2, :, 9:30] == 10 ** layer)  # from its start
            assert torch.all(k[2, :, 30:] == 0) and torch.all(k[1, :, :30] == 2 * 10 ** layer)


@pytest.mark.parametrize("forks, gathered", [
    ([(2, 0, 3, 17), (4, 2, 0, 9), (1, 3, 12, 13), (3, 0, 5, 5)], True),  # many
    ([(2, 0, 3, 17), (4, 1, 0, 9)], False),  # a few: a slice's copy each
    ([(2, 0, 3, 17), (4, 2, 0, 9)], True),  # a few, but a target another's parent
])
def test_many_forks_at_once_copy_each_its_own_columns_in_place(forks, gathered, monkeypatch):
    """Forks of unlike starts and lengths in one call, a slot both a fork's parent and
    another's target: each target's columns start .. length - 1 are its parent's as they
    were before the call, head by head and column by column; nothing else changes. Many
    forks, or any whose target is another's parent, are copied by one gather of every
    target's columns first (flat_index); up to SLICED_FORKS others by a slice each."""
    indexed = []
    monkeypatch.setattr(cache_module, "flat_index",
                        lambda *a: indexed.append(1) or flat_index(*a))
    c = cache()
    filled(c, 5, length=30)
    for layer in range(c.n_layers):  # every number its own
        for i, t in enumerate((c.k, c.v)):
            t[layer].copy_(torch.arange(t[layer].numel()).view_as(t[layer]) * (i + 1 + layer))
    before = [[t.clone() for t in ts] for ts in (c.k, c.v)]
    c.fork(forks)
    assert bool(indexed) == gathered
    for ts, old in zip((c.k, c.v), before, strict=True):
        for t, was in zip(ts, old, strict=True):
            want = was.clone()
            for target, parent, start, length in forks:
                want[target, :, start:length] = was[parent, :, start:length]
            assert torch.equal(t, want)


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
    assert c.groups(3) is None  # row i reads source slot i
    step = c.step(StepPlan(torch.zeros(3, 1, dtype=torch.long, device=DEVICE), width=5,
                           cross=3))
    own, cross = step.layers[0]
    assert own.k.data_ptr() == c.k[0].data_ptr()  # a view: no copy
    assert own.k.shape == (3, 2, 5, 4) and cross.k.shape == (3, 2, 3, 4)
    picked = c.step(StepPlan(torch.zeros(2, 1, dtype=torch.long, device=DEVICE), width=5,
                             slots=torch.tensor([2, 0], device=DEVICE), cross=3,
                             sources=torch.tensor([2, 0], device=DEVICE)))
    own, cross = picked.layers[1]
    assert torch.all(own.k[0] == 30) and torch.all(own.k[1] == 10)
    assert torch.all(cross.k[0] == 30) and torch.all(cross.k[1] == 10)


def test_rows_that_share_a_source_attend_over_one_copy_as_if_each_had_its_own():
    """Two requests, of three rows and one, their rows interleaved in the slots: grouped
    cross-attention over the two sources equals attention of each row over its own copy."""
    torch.manual_seed(0)
    c = cache()
    a, b = request(), request()
    owners = [a, b, a, a]
    for owner in owners:
        c.take(Sequence([1]), owner)
    c.take_source(b, 3)  # source slots in another order than the rows'
    c.take_source(a, 5)
    for t in (c.ck[0], c.cv[0]):
        t.normal_()
    members, place = c.groups(4)
    assert members.tolist() == [[1, 0, 0], [0, 2, 3]]  # b's row (padded), a's three rows
    assert place.tolist() == [3, 0, 4, 5]
    step = c.step(StepPlan(torch.zeros(4, 2, dtype=torch.long, device=DEVICE), width=2,
                           cross=5, groups=(members, place)))
    cross = step.layers[0][1]
    q = torch.randn(4, 2, 2, 4, device=DEVICE)  # (R, H, T, Dh)
    lengths = torch.tensor([3, 5], device=DEVICE)
    mask = torch.arange(5, device=DEVICE)[None, None, None, :] < lengths[:, None, None, None]
    out = cross.outputs(F.scaled_dot_product_attention(cross.queries(q), cross.k, cross.v,
                                                       attn_mask=mask))
    for i, owner in enumerate(owners):
        g, n = owner.source_slot, c.lengths[owner.source_slot]
        alone = F.scaled_dot_product_attention(q[i:i + 1], c.ck[0][g:g + 1, :, :n],
                                               c.cv[0][g:g + 1, :, :n])
        torch.testing.assert_close(out[i:i + 1], alone)


def test_a_steps_cross_attention_reads_each_part_of_sources_to_its_own_longest():
    """Sources of unlike lengths in consecutive source slots: the step reads them in parts,
    each to its longest source, neighbours of one width merged; sources of like lengths (or
    too few slots) in one pass."""
    c = cache(max_rows=5 * PART, tokens=5 * PART * 96, max_len=90)
    lengths = [3] * PART + [5] * (PART - 1) + [3] + [5] * PART + [40] * PART + [80] * PART
    for n in lengths:
        c.take_source(request(), n)
    assert c.parts() == [(0, PART, 3), (PART, 3 * PART, 5), (3 * PART, 4 * PART, 40),
                         (4 * PART, 5 * PART, 80)]
    assert parts([n + 1 for n in lengths]) == [(0, PART, 4), (PART, 3 * PART, 6),
                                                (3 * PART, 4 * PART, 41),
                                                (4 * PART, 5 * PART, 81)]
    c = cache(max_rows=4 * PART, tokens=4 * PART * 96, max_len=90)
    for n in [70] * (2 * PART) + [80] * (2 * PART):
        c.take_source(request(), n)
    assert c.parts() is None  # 80 against 70: not a quarter saved
    c = cache()
    for n in (3, 40):
        c.take_source(request(), n)
    assert c.parts() is None  # one part


def test_a_step_writing_one_column_writes_what_the_indexed_write_does():
    """Every row's new token to one column (an offline batch in step): the slice write
    leaves the cache as the (slot, column) write does."""
    torch.manual_seed(0)
    a, b = cache(), cache()
    filled(a, 3)
    filled(b, 3)
    k, v = torch.randn(3, 2, 1, 4, device=DEVICE), torch.randn(3, 2, 1, 4, device=DEVICE)
    columns = torch.full((3, 1), 2, device=DEVICE)
    sliced = a.step(StepPlan(columns, width=3, column=2)).layers[1][0]
    indexed = b.step(StepPlan(columns, width=3)).layers[1][0]
    assert isinstance(sliced.write, int) and not isinstance(indexed.write, int)
    for got, want in zip(sliced.append(k, v), indexed.append(k, v), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(a.k[1], b.k[1]) and torch.equal(a.v[1], b.v[1])
    assert torch.equal(a.k[1][:3, :, 2:3], k)


def test_keys_written_by_flat_index_land_where_slot_and_column_indexing_puts_them():
    """Rows at unlike columns, several tokens each (a prefill): the copy through the cache
    seen as rows of Dh numbers equals indexing (slot, :, column)."""
    torch.manual_seed(0)
    t = torch.zeros(6, 3, 20, 4)
    want = t.clone()
    slots = torch.tensor([4, 0, 2])
    columns = torch.tensor([[5, 6], [0, 1], [17, 19]])
    k = torch.randn(3, 3, 2, 4)  # (R, heads, T, Dh)
    want[slots[:, None], :, columns] = k.transpose(1, 2)
    t.view(-1, 4).index_copy_(0, flat_index(slots, columns, 3, 20).view(-1), k.reshape(-1, 4))
    assert torch.equal(t, want)


def test_memory_follows_the_rows_in_use_not_the_models_context():
    """A model that claims 131,072 positions, a budget of 4,096: the tensors start with one
    slot of START_WIDTH positions, gain slots by doubling as rows are taken (the rows' keys
    kept), and go back to one when the engine is idle; the nominal context costs nothing."""
    from vaswani.engine.cache import START_WIDTH

    c = cache(tokens=4096, max_len=131_072, seq2seq=False)
    assert (c.width, c.allocated) == (START_WIDTH, 1)
    assert c.k[0].numel() == 2 * START_WIDTH * 4  # one slot: 2 heads x width x 4
    rows = []
    for i in range(5):
        rows.append(Sequence([0] * 5))
        c.take(rows[-1], request())
        c.k[1][rows[-1].slot, :, :5] = i + 1
    assert c.allocated == 8 and c.rows == 4096 // START_WIDTH
    for i, row in enumerate(rows):
        assert (c.k[1][row.slot, :, :5] == i + 1).all()
    for row in rows:
        c.free(row)
    c.compact()
    c.restart()
    assert (c.width, c.allocated) == (START_WIDTH, 1)
