"""experiments/decode_kernels.py: each experiment times both ways on equal outputs (timing
is never asserted)."""

from experiments import decode_kernels


def test_a_linear_layers_two_paths_are_timed_on_equal_products(monkeypatch):
    """linear: both paths for each weight and row count, each timed (the products are
    checked equal inside), the oneDNN one taken whatever this CPU's vendor, and the choice
    cpu/linear.py made for this CPU left as it was."""
    import vaswani.cpu.linear

    calls = []
    onednn = vaswani.cpu.linear.OneDNNLinear._onednn
    monkeypatch.setattr(vaswani.cpu.linear.OneDNNLinear, "_onednn",
                        lambda self, *a: calls.append(a[0].shape) or onednn(self, *a))
    chosen = vaswani.cpu.linear.OneDNNLinear.onednn
    rows = decode_kernels.linear_paths(shapes=[(50, 16)], rows=(1, 4096), repeats=1, calls=2)
    assert list(rows) == ["50 x 16, 1 rows", "50 x 16, 4096 rows"]
    for r in rows.values():
        assert r["f_linear_ms"] >= 0 and r["linear_ms"] >= 0 and r["f_linear_over_linear"] > 0
    assert calls and all(shape == (4096, 16) for shape in calls)  # large enough: oneDNN
    assert vaswani.cpu.linear.OneDNNLinear.onednn is chosen  # the class's choice untouched


def test_a_frozen_weights_two_training_paths_are_timed_on_equal_gradients(monkeypatch):
    """frozen-linear: F.linear and frozen_linear (oneDNN) each forward and backward at each
    shape, the input's gradients checked equal inside; oneDNN taken on any CPU."""
    import torch

    calls = []
    real = torch.ops.mkldnn._linear_pointwise
    monkeypatch.setattr(torch.ops.mkldnn, "_linear_pointwise",
                        lambda *a: calls.append(a[0].shape) or real(*a), raising=False)
    rows = decode_kernels.frozen_paths(shapes=[(50, 16), (16, 50)], rows=8, repeats=1, calls=1)
    assert list(rows) == ["50 x 16, 8 rows", "16 x 50, 8 rows"]
    for r in rows.values():
        assert r["f_linear_ms"] > 0 and r["frozen_ms"] > 0 and r["f_linear_over_frozen"] > 0
    assert (8, 16) in calls and (8, 50) in calls  # forward and backward by oneDNN


def test_a_bursts_prefill_is_timed_both_ways_with_the_same_outputs():
    burst = decode_kernels.prefill_burst(rounds=1, n=4, d_model=32, layers=1)
    assert set(burst["first_step_ms"]) == {"one pass", "grouped"}
    assert all(len(ms) == 1 and ms[0] > 0 for ms in burst["first_step_ms"].values())
    assert burst["same_outputs"] is True and burst["one_pass_over_grouped"] > 0


def test_a_decoding_steps_attention_is_timed_every_way_on_equal_outputs():
    timed = decode_kernels.decode_attention(shapes=[(4, 1, 10, 8), (2, 4, 12, 8)], repeats=1,
                                     calls=2)
    assert list(timed) == ["4 rows x 1 queries, 10 keys, head dim 8",
                           "2 rows x 4 queries, 12 keys, head dim 8"]
    for r in timed.values():
        assert r["sdpa_ms"] > 0 and r["written_out_ms"] > 0 and r["written_out_over_sdpa"] > 0
        assert r["decoding_ms"] > 0 and r["decoding_over_written_out"] > 0


def test_a_steps_cache_writes_are_timed_in_both_kinds_of_page_with_the_same_numbers():
    timed = decode_kernels.cache_writes(rounds=1, steps=3, tensors=2, slots=8, rows=6, heads=2,
                                 width=16, dh=8, between=1000)
    assert set(timed["us_per_write"]) == {"4 KiB pages", "huge pages"}
    assert all(us > 0 for us in timed["us_per_write"].values())
    assert timed["four_k_over_huge"] > 0 and timed["same_writes"] is True


def test_attention_over_cold_keys_is_timed_for_packed_and_wider_slots():
    timed = decode_kernels.cold_keys(rows=4, heads=2, keys=3, dh=4, widths=(3, 8),
                                     bytes_cycled=4096, rounds=1)
    assert list(timed) == ["slots 3 wide (packed)", "slots 8 wide"]
    assert all(r["us"] > 0 and r["gb_per_s"] >= 0 for r in timed.values())


def test_a_beam_steps_ranking_is_timed_both_ways_on_equal_outputs():
    timed = decode_kernels.top_k_rows(rows=(3,), vocab=640, repeats=1, calls=2)
    assert list(timed) == ["3 rows x 640, k 8"]
    r = timed["3 rows x 640, k 8"]
    assert r["topk_ms"] > 0 and r["top_k_ms"] > 0 and r["topk_over_top_k"] > 0


def test_a_greedy_steps_choice_is_timed_both_ways_on_equal_outputs():
    timed = decode_kernels.first_max_rows(rows=(1, 9), vocab=640, repeats=1, calls=2)
    assert list(timed) == ["1 rows x 640", "9 rows x 640"]
    assert all(r["max_ms"] > 0 and r["first_max_ms"] > 0 and r["max_over_first_max"] > 0
               for r in timed.values())
