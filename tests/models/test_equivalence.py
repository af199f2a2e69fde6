"""vaswani's layers, stacks and EncoderDecoder == torch.nn's, with copied weights, float64."""

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from tests.reference import copy_decoder_layer, copy_encoder_layer, copy_norm, randomize
from vaswani import ModelConfig, build_model
from vaswani.nn import (
    DecoderLayer,
    EncoderLayer,
    FeedForward,
    Heads,
    LayerNorm,
    MultiHeadAttention,
    Residual,
    masks,
)

D, H, FF = 16, 4, 32


def _residual(norm_first):
    return lambda: Residual(LayerNorm(D), 0.0, norm_first)


def _keep(lengths, total):
    return torch.arange(total)[None, :] < torch.tensor(lengths)[:, None]


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(norm_first, activation):
    ref = nn.TransformerEncoderLayer(D, H, FF, dropout=0.0, activation=activation,
                                     batch_first=True, norm_first=norm_first,
                                     dtype=torch.float64)
    randomize(ref)
    ours = EncoderLayer(MultiHeadAttention(Heads(D, H)), FeedForward(D, FF, activation=activation),
                        _residual(norm_first)).double()
    copy_encoder_layer(ours, ref)
    x = torch.randn(3, 6, D, dtype=torch.float64)
    keep = _keep([6, 2, 4], 6)
    expected = ref(x, src_key_padding_mask=~keep)
    out, _ = ours(x, mask=masks.key_padding_mask(keep))
    assert_close(out[keep], expected[keep])


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(norm_first):
    ref = nn.TransformerDecoderLayer(D, H, FF, dropout=0.0, batch_first=True,
                                     norm_first=norm_first, dtype=torch.float64)
    randomize(ref)
    ours = DecoderLayer(MultiHeadAttention(Heads(D, H)), FeedForward(D, FF), _residual(norm_first),
                        MultiHeadAttention(Heads(D, H))).double()
    copy_decoder_layer(ours, ref)
    x = torch.randn(3, 5, D, dtype=torch.float64)
    memory = torch.randn(3, 7, D, dtype=torch.float64)
    tgt_keep, src_keep = _keep([5, 3, 4], 5), _keep([7, 7, 2], 7)
    causal = masks.causal_mask(5)
    expected = ref(x, memory, tgt_mask=~causal, tgt_key_padding_mask=~tgt_keep,
                   memory_key_padding_mask=~src_keep)
    out, _ = ours(x, memory=memory, mask=masks.decoder_self_mask(tgt_keep, 5),
                  memory_mask=masks.key_padding_mask(src_keep))
    assert_close(out[tgt_keep], expected[tgt_keep])


def _pair(norm_first):
    """An EncoderDecoder and an nn.Transformer with the same (random) weights."""
    cfg = ModelConfig(arch="encoder-decoder", vocab_size=23, tgt_vocab_size=19, d_model=D,
                      n_heads=H, d_ff=FF, n_encoder_layers=2, n_decoder_layers=3, dropout=0.0,
                      norm_first=norm_first, max_len=32)
    ours = build_model(cfg).double().eval()
    ref = nn.Transformer(D, H, num_encoder_layers=2, num_decoder_layers=3, dim_feedforward=FF,
                         dropout=0.0, batch_first=True, norm_first=norm_first,
                         dtype=torch.float64).eval()
    randomize(ref)
    for a, b in zip(ours.encoder.layers, ref.encoder.layers, strict=True):
        copy_encoder_layer(a, b)
    for a, b in zip(ours.decoder.layers, ref.decoder.layers, strict=True):
        copy_decoder_layer(a, b)
    if norm_first:
        copy_norm(ours.encoder.norm, ref.encoder.norm)
        copy_norm(ours.decoder.norm, ref.decoder.norm)
    else:
        # nn.Transformer always appends a final LayerNorm to both stacks, even post-LN; the
        # paper's post-LN model has none (each layer already ends normalised). Remove it.
        ref.encoder.norm = None
        ref.decoder.norm = None
    return ours, ref


def _batch():
    src = torch.randint(1, 23, (3, 8))
    tgt = torch.randint(1, 19, (3, 6))
    src[1, 5:] = 0
    src[2, 2:] = 0
    tgt[1, 4:] = 0
    tgt[2, 1:] = 0
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_decoder_matches_torch_transformer(norm_first):
    ours, ref = _pair(norm_first)
    src, tgt = _batch()
    src_keep, tgt_keep = src != 0, tgt != 0
    expected_h = ref(ours.src_embed(src), ours.tgt_embed(tgt),
                     tgt_mask=~masks.causal_mask(tgt.size(1)),
                     src_key_padding_mask=~src_keep, tgt_key_padding_mask=~tgt_keep,
                     memory_key_padding_mask=~src_keep)
    expected = ours.output_proj(expected_h)
    logits = ours(src, tgt)
    assert logits.shape == (3, 6, 19)
    assert_close(logits[tgt_keep], expected[tgt_keep])


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_stack_matches_torch_transformer_encoder(norm_first):
    ours, ref = _pair(norm_first)
    src, _ = _batch()
    keep = src != 0
    encoder = ref.encoder  # an nn.TransformerEncoder
    expected = encoder(ours.src_embed(src), src_key_padding_mask=~keep)
    assert_close(ours.encode(src)[keep], expected[keep])
