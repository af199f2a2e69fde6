"""cpu/attention.py: a CPU's choice between SDPA and the written-out products, and a decoding
step's lean path, give what nn/'s attention gives."""

import pytest
import torch
from torch.testing import assert_close

from vaswani.cpu import fast_paths
from vaswani.cpu.attention import CPUAttention, decoding_attention, one_query_attention
from vaswani.nn import Attention, Heads, MultiHeadAttention, masks, scaled_dot_product_attention
from vaswani.nn.attention import repeat_kv

pytestmark = pytest.mark.usefixtures("on_cpu")  # the CPU's own path


def _padding(lengths, total):
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]  # (B, total)


@pytest.mark.parametrize("tq", [1, 4])
def test_decoding_attention_equals_the_reference_on_rows_that_see_a_key(tq):
    q = torch.randn(3, 4, tq, 8, dtype=torch.float64)
    k, v = torch.randn(2, 3, 4, 7, 8, dtype=torch.float64)
    mask = masks.key_padding_mask(_padding([7, 1, 5], 7))  # every row sees a key
    assert_close(decoding_attention(q, k, v, mask), scaled_dot_product_attention(q, k, v, mask)[0])
    assert_close(decoding_attention(q, k, v), scaled_dot_product_attention(q, k, v)[0])


@pytest.mark.parametrize("tq", [1, 3])
@pytest.mark.parametrize("heads", ["shared", "per head"])
def test_decoding_attention_reads_grouped_keys_without_copying_them(tq, heads):
    """Grouped-query attention: 6 query heads over 2 key/value heads, as if each key/value
    head were repeated for its 3 queries, under a mask of each query's position (one for
    all heads, or one per head)."""
    q = torch.randn(3, 6, tq, 8, dtype=torch.float64)
    k, v = torch.randn(2, 3, 2, 9, 8, dtype=torch.float64)
    positions = torch.tensor([[8], [3], [5]]) - torch.arange(tq).flip(0)  # (3, tq)
    mask = masks.position_mask(positions, 9)  # (3, 1, tq, 9)
    if heads == "per head":
        mask = mask.expand(3, 6, tq, 9).clone()
        mask[:, 1, :, 0] = False  # one head of each row does not see its first key
    want = scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), mask)[0]
    assert_close(decoding_attention(q, k, v, mask), want)
    assert_close(decoding_attention(q, k, v), scaled_dot_product_attention(
        q, repeat_kv(k, 3), repeat_kv(v, 3))[0])


@pytest.mark.parametrize("heads", ["shared", "per head"])
def test_one_query_attention_as_sums_equals_the_reference_with_grouped_heads(heads):
    """A compiled decode step's attention (one query a row, sums of products): 6 query heads
    over 2 key/value heads under each row's mask of its keys, as the reference over the
    keys repeated; a row that sees no key gets the mean of its values."""
    q = torch.randn(4, 6, 1, 8, dtype=torch.float64)
    k, v = torch.randn(2, 4, 2, 9, 8, dtype=torch.float64)
    mask = masks.position_mask(torch.tensor([[8], [3], [1], [5]]), 9)  # (4, 1, 1, 9)
    if heads == "per head":
        mask = mask.expand(4, 6, 1, 9).clone()
        mask[:, 1, :, 0] = False  # one head of each row does not see its first key
    want = scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3), mask)[0]
    assert_close(one_query_attention(q, k, v, mask), want)
    assert_close(one_query_attention(q, k, v), scaled_dot_product_attention(
        q, repeat_kv(k, 3), repeat_kv(v, 3))[0])
    blind = torch.zeros(4, 1, 1, 9, dtype=torch.bool)
    assert_close(one_query_attention(q, k, v, blind), repeat_kv(v, 3).mean(-2, keepdim=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_auto_matches_sdpa_for_short_and_long_keys(dtype):
    """The auto backend takes the written-out path for short bf16 keys and SDPA otherwise;
    either way it computes the same function."""
    torch.manual_seed(0)
    mha = fast_paths(MultiHeadAttention(Heads(32, 4)).to(dtype).eval())
    attention = mha.attention
    assert type(attention) is CPUAttention
    for T in (16, 600):
        x = torch.randn(2, T, 32, dtype=dtype)
        mask = torch.ones(T, T, dtype=torch.bool).tril()
        out_auto, weights = mha(x, mask=mask)
        assert weights is None  # weights only when asked for
        attention.backend = "sdpa"
        out_sdpa, _ = mha(x, mask=mask)
        attention.backend = "auto"
        tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else {}
        assert_close(out_auto, out_sdpa, **tol)
    assert attention.use_sdpa(torch.ones(1, 1, 1, 8), torch.ones(1, 1, 64, 8), 0.0)
    assert not attention.use_sdpa(torch.ones(1, 1, 1, 8, dtype=torch.bfloat16),
                                  torch.ones(1, 1, 64, 8), 0.0)
    assert attention.use_sdpa(torch.ones(1, 1, 1, 8, dtype=torch.bfloat16),
                              torch.ones(1, 1, 513, 8), 0.0)
    # fp32 decoding steps: many rows of few queries -> written out; a few rows -> SDPA
    assert not attention.use_sdpa(torch.ones(256, 4, 1, 8), torch.ones(256, 4, 48, 8), 0.0)
    assert not attention.use_sdpa(torch.ones(64, 4, 4, 8), torch.ones(64, 4, 40, 8), 0.0)
    assert attention.use_sdpa(torch.ones(1, 4, 1, 8), torch.ones(1, 4, 100, 8), 0.0)
    assert attention.use_sdpa(torch.ones(64, 4, 64, 8), torch.ones(64, 4, 64, 8), 0.0)  # training


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_auto_on_a_decoding_step_equals_sdpa(n_kv_heads):
    """A decoding step's shape (many rows of one query over padded keys, and a beam search's
    four grouped queries per row) takes the written-out path on a CPU: the same outputs."""
    torch.manual_seed(0)
    attention = CPUAttention().eval()
    for rows, queries, keys in [(256, 1, 48), (64, 4, 40)]:
        q = torch.randn(rows, 4, queries, 8)
        k, v = torch.randn(2, rows, n_kv_heads, 80, 8)[:, :, :, :keys]  # views of wider slots
        mask = (torch.arange(keys) < torch.randint(1, keys + 1, (rows, 1)))[:, None, None]
        assert not attention.use_sdpa(q, k, 0.0)
        with torch.no_grad():
            out, _ = attention(q, k, v, mask)
            attention.backend = "sdpa"
            expected, _ = attention(q, k, v, mask)
            attention.backend = "auto"
        assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_a_decoding_step_without_gradients_takes_the_lean_path_and_agrees(monkeypatch):
    """Under inference (no gradients), a step of one query per row runs decoding_attention
    and gives what nn/'s written-out path gives with gradients on (training's path)."""
    from vaswani.cpu import attention

    torch.manual_seed(2)
    mha = MultiHeadAttention(Heads(16, 4), Attention(backend="reference")).double().eval()
    x = torch.randn(3, 1, 16, dtype=torch.float64)
    memory = torch.randn(3, 6, 16, dtype=torch.float64)
    mask = _padding([6, 2, 4], 6)[:, None, None, :]
    expected, _ = mha(x, memory=memory, mask=mask)
    fast_paths(mha)
    calls = []
    lean = attention.decoding_attention
    monkeypatch.setattr(attention, "decoding_attention",
                        lambda *a: calls.append(1) or lean(*a))
    with torch.inference_mode():
        out, _ = mha(x, memory=memory, mask=mask)
    assert calls and not torch.is_inference(expected)
    assert_close(out, expected)


def test_attention_dropout_draws_the_cpus_lanes_and_keeps_the_mean():
    """Training with dropout on the weights takes the written-out path with the CPU's dropout
    (cpu/dropout.py) on them; the weights still sum to 1 in expectation."""
    torch.manual_seed(0)
    attention = CPUAttention(dropout=0.5).train()
    q, k, v = torch.randn(3, 64, 4, 16, 8)
    assert not attention.use_sdpa(q, k, 0.5)
    _, weights = attention(q, k, v, need_weights=True)
    dropped = (weights == 0).double().mean().item()
    assert 0.45 < dropped < 0.55
    assert abs(weights.sum(-1).mean().item() - 1.0) < 0.05
