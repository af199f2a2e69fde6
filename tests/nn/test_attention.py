import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from tests.reference import copy_mha
from vaswani.nn import (
    Attention,
    Heads,
    MultiHeadAttention,
    Rotary,
    masks,
    scaled_dot_product_attention,
)

B, H, TQ, TK, DH = 3, 4, 5, 7, 8


def _qkv(tq=TQ, tk=TK):
    q = torch.randn(B, H, tq, DH, dtype=torch.float64)
    k = torch.randn(B, H, tk, DH, dtype=torch.float64)
    v = torch.randn(B, H, tk, DH, dtype=torch.float64)
    return q, k, v


def _padding(lengths, total):
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]  # (B, total)


def test_reference_matches_sdpa_with_padding_and_causal_masks():
    q, k, v = _qkv()
    keep = _padding([7, 4, 6], TK)
    mask = masks.combine(masks.key_padding_mask(keep), masks.causal_mask(TQ, TK))
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(out, expected)
    # Weights: rows sum to 1, exactly 0 where masked.
    assert_close(weights.sum(-1), torch.ones(B, H, TQ, dtype=torch.float64))
    assert torch.all(weights.masked_select(~mask.expand_as(weights)) == 0)


def test_reference_matches_sdpa_without_mask():
    q, k, v = _qkv()
    out, _ = scaled_dot_product_attention(q, k, v)
    assert_close(out, F.scaled_dot_product_attention(q, k, v))


def test_scaling_is_by_sqrt_head_dim():
    q, k, v = _qkv()
    _, weights = scaled_dot_product_attention(q, k, v)
    manual = (q @ k.transpose(-2, -1) / DH**0.5).softmax(-1)
    assert_close(weights, manual)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_fully_masked_rows_give_zeros_not_nan(backend):
    torch.manual_seed(1)
    mha = MultiHeadAttention(Heads(16, 4), Attention(backend=backend)).double()
    x = torch.randn(2, 3, 16, dtype=torch.float64)
    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool)
    mask[0, :, 1, :] = False  # query 1 of sequence 0 may see nothing
    out, _ = mha(x, mask=mask)
    assert not torch.isnan(out).any()
    # A row that saw no key gets a zero attention output; only the output bias remains.
    assert_close(out[0, 1], mha.out_proj.bias)


def test_fully_masked_rows_in_bf16_reference():
    q, k, v = (t.bfloat16() for t in _qkv())
    mask = torch.zeros(B, 1, TQ, TK, dtype=torch.bool)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    assert not torch.isnan(out).any() and torch.all(weights == 0)


def _torch_mha(d=16, h=4):
    ref = nn.MultiheadAttention(d, h, batch_first=True, dtype=torch.float64)
    ours = MultiHeadAttention(Heads(d, h)).double()
    copy_mha(ours, ref)
    return ours.eval(), ref.eval()


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_self_attention_matches_torch_multihead_attention(backend):
    ours, ref = _torch_mha()
    ours.attention.backend = backend
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    keep = _padding([6, 3, 5], 6)
    causal = masks.causal_mask(6)
    mask = masks.combine(masks.key_padding_mask(keep), causal)
    out, _ = ours(x, mask=mask)
    # torch's boolean masks mean True = IGNORE: invert ours.
    expected, _ = ref(x, x, x, key_padding_mask=~keep, attn_mask=~causal, need_weights=False)
    assert_close(out, expected)


def test_cross_attention_matches_torch_multihead_attention_with_key_padding():
    ours, ref = _torch_mha()
    x = torch.randn(3, 4, 16, dtype=torch.float64)
    memory = torch.randn(3, 9, 16, dtype=torch.float64)
    keep = _padding([9, 2, 6], 9)
    out, weights = ours(x, memory=memory, mask=masks.key_padding_mask(keep), need_weights=True)
    expected, expected_w = ref(x, memory, memory, key_padding_mask=~keep,
                               average_attn_weights=False)
    assert_close(out, expected)
    assert_close(weights, expected_w)


def test_need_weights_uses_reference_path_and_agrees_with_sdpa():
    ours, _ = _torch_mha()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    fast, none = ours(x)
    slow, weights = ours(x, need_weights=True)
    assert none is None and weights.shape == (2, 4, 5, 5)
    assert_close(fast, slow)


def test_grouped_query_attention_equals_full_attention_with_repeated_kv_heads():
    torch.manual_seed(2)
    d, h, hkv = 16, 4, 2
    dh = d // h
    gqa = MultiHeadAttention(Heads(d, h, hkv)).double().eval()
    full = MultiHeadAttention(Heads(d, h)).double().eval()
    with torch.no_grad():
        wq, wk, wv = gqa.in_proj.weight.split([d, hkv * dh, hkv * dh])
        bq, bk, bv = gqa.in_proj.bias.split([d, hkv * dh, hkv * dh])

        def repeat(w):  # (Hkv*Dh, ...) -> (H*Dh, ...), each kv head serving h // hkv q heads
            return w.reshape(hkv, dh, *w.shape[1:]).repeat_interleave(h // hkv, 0).reshape(
                h * dh, *w.shape[1:])

        full.in_proj.weight.copy_(torch.cat([wq, repeat(wk), repeat(wv)]))
        full.in_proj.bias.copy_(torch.cat([bq, repeat(bk), repeat(bv)]))
        full.out_proj.load_state_dict(gqa.out_proj.state_dict())
    x = torch.randn(2, 6, d, dtype=torch.float64)
    mask = masks.causal_mask(6)
    expected, _ = full(x, mask=mask)
    for backend in ("sdpa", "reference"):
        gqa.attention.backend = backend
        out, _ = gqa(x, mask=mask)
        assert_close(out, expected)
    assert gqa.in_proj.weight.shape == (d + 2 * hkv * dh, d)


def test_bad_head_counts_raise_clear_errors():
    with pytest.raises(ValueError, match=r"d_model \(30\) must be divisible by n_heads \(4\)"):
        Heads(30, 4)
    with pytest.raises(ValueError, match=r"n_heads \(4\) must be divisible by n_kv_heads \(3\)"):
        Heads(32, 4, n_kv_heads=3)
    with pytest.raises(ValueError, match="backend"):
        Attention(backend="flash")
    with pytest.raises(ValueError, match="even head dim"):
        Rotary(7)


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
def test_a_window_is_a_mask_and_cached_decoding_keeps_it(backend):
    """Local attention (window 3) equals full attention under the window's mask written out,
    and decoding one token at a time through a cache gives the same outputs."""
    from vaswani.nn.kv_cache import KV

    torch.manual_seed(0)
    local = MultiHeadAttention(Heads(16, 4, 2), Attention(backend=backend), rotary=Rotary(4),
                               window=3).double().eval()
    full = MultiHeadAttention(Heads(16, 4, 2), Attention(backend=backend),
                              rotary=Rotary(4)).double().eval()
    full.load_state_dict(local.state_dict())
    x = torch.randn(2, 9, 16, dtype=torch.float64)
    causal = masks.causal_mask(9)
    expected, _ = full(x, mask=causal & (torch.arange(9)[None, :] > torch.arange(9)[:, None] - 3))
    out, _ = local(x, mask=causal)
    assert_close(out, expected)
    assert not torch.allclose(out, full(x, mask=causal)[0])  # the window acts
    cache = KV()
    steps = [local(x[:, t:t + 1], cache=cache)[0] for t in range(9)]
    assert_close(torch.cat(steps, dim=1), expected)
