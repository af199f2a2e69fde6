import math

import pytest
import torch
from torch.testing import assert_close

from vaswani.nn import Embeddings, sinusoidal_table
from vaswani.nn.positional import embedding, positions


def _embeddings(vocab, d, max_len, kind="sinusoidal", **kwargs):
    return Embeddings(embedding(vocab, d, padding_idx=0), positions(kind, max_len, d), **kwargs)


def paper_formula(max_len, d_model):
    """Section 3.5 of the paper, one number at a time in plain Python."""
    rows = []
    for pos in range(max_len):
        row = []
        for j in range(d_model):
            i = j // 2
            angle = pos / 10000 ** (2 * i / d_model)
            row.append(math.sin(angle) if j % 2 == 0 else math.cos(angle))
        rows.append(row)
    return torch.tensor(rows)


@pytest.mark.parametrize("d_model", [16, 7])
def test_sinusoidal_table_matches_the_paper(d_model):
    assert_close(sinusoidal_table(50, d_model), paper_formula(50, d_model))


def test_sinusoidal_is_interleaved_with_base_10000():
    table = sinusoidal_table(20, 8)
    concatenated = torch.cat([table[:, 0::2], table[:, 1::2]], dim=1)
    assert not torch.allclose(table, concatenated)
    assert not torch.allclose(table, sinusoidal_table(20, 8, base=1000.0))


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_explicit_positions_equal_a_slice_of_the_full_sequence(positional):
    emb = _embeddings(11, 8, 16, positional).eval()
    ids = torch.randint(1, 11, (2, 6))
    full = emb(ids)
    tail = emb(ids[:, 4:], positions=torch.arange(4, 6))
    assert_close(tail, full[:, 4:])


def test_embedding_scale_flag():
    scaled = _embeddings(11, 16, 8, "none", scale=True)
    plain = _embeddings(11, 16, 8, "none", scale=False)
    plain.load_state_dict(scaled.state_dict())
    ids = torch.randint(0, 11, (1, 4))
    assert_close(scaled(ids), plain(ids) * 4.0)


def test_position_past_max_len_is_a_clear_error():
    emb = _embeddings(11, 8, 4)
    with pytest.raises(ValueError, match=r"position 4 is past max_len \(4\)"):
        emb(torch.ones(1, 5, dtype=torch.long))


def test_an_unknown_positional_kind_is_named():
    with pytest.raises(ValueError, match="positional \\('alibi'\\) must be"):
        positions("alibi", 8, 4)
