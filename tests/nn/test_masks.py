import pytest
import torch

from vaswani.nn import masks


def test_causal_square_is_lower_triangular():
    assert torch.equal(masks.causal_mask(3), torch.ones(3, 3, dtype=torch.bool).tril())


def test_causal_is_bottom_right_aligned_when_queries_are_fewer_than_keys():
    # Two new queries after three cached keys: positions 3 and 4 of 5.
    expected = torch.tensor([[1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(masks.causal_mask(2, 5), expected)
    # One query (one decoding step) sees every key.
    assert masks.causal_mask(1, 4).all()


def test_causal_rejects_more_queries_than_keys():
    with pytest.raises(ValueError, match="k_len"):
        masks.causal_mask(4, 2)


def test_padding_and_decoder_mask_shapes_and_polarity():
    ids = torch.tensor([[5, 6, 0], [7, 0, 0]])
    keep = masks.padding_mask(ids, pad_id=0)
    assert keep.tolist() == [[True, True, False], [True, False, False]]
    assert masks.key_padding_mask(keep).shape == (2, 1, 1, 3)
    m = masks.decoder_self_mask(keep, 3)
    assert m.shape == (2, 1, 3, 3)
    # Sequence 1, query 2 (a pad position) may only see key 0: causal AND not padding.
    assert m[1, 0, 2].tolist() == [True, False, False]
    assert masks.combine(None, None) is None

