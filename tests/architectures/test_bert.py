"""vaswani's encoder with BERT options vs Hugging Face BertModel on the same random weights."""

import pytest
import torch
from torch.testing import assert_close

from vaswani.architectures.bert import config_from_hf
from vaswani.architectures.bert import from_hf as convert_state_dict
from vaswani.models import build_model

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")


def small_bert():
    hf_config = transformers.BertConfig(
        vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=40, type_vocab_size=2,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    hf = transformers.BertModel(hf_config).double().eval()
    with torch.no_grad():  # LayerNorms away from their 1/0 init, so they are really tested
        for name, p in hf.named_parameters():
            if "LayerNorm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf, hf_config.to_dict()


def test_encoder_matches_bert_model_on_a_padded_batch():
    hf, hf_config = small_bert()
    config = config_from_hf(hf_config)
    ours = build_model(config).double().eval()
    state = convert_state_dict(hf.state_dict(), config, hf_config)
    missing, unexpected = ours.load_state_dict(state, strict=False)
    assert not unexpected and not missing
    ids = torch.randint(5, 100, (3, 12))
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[1, 7:] = False
    mask[2, 3:] = False
    ids[~mask] = 0
    expected = hf(input_ids=ids, attention_mask=mask.long()).last_hidden_state
    hidden = ours.encode(ids, mask=mask)
    assert_close(hidden[mask], expected[mask])  # padding positions are free to differ
    emb = ours.sentence_embeddings(hidden, mask)
    ref = torch.nn.functional.normalize(
        (expected * mask[..., None]).sum(1) / mask.sum(1, keepdim=True), dim=-1)
    assert_close(emb, ref)


def test_config_rejects_what_it_cannot_run():
    _, hf_config = small_bert()
    with pytest.raises(ValueError, match="not BERT"):
        config_from_hf({**hf_config, "model_type": "roberta"})
    with pytest.raises(ValueError, match="hidden_act"):
        config_from_hf({**hf_config, "hidden_act": "swish"})


def test_headless_encoder_refuses_to_classify():
    _, hf_config = small_bert()
    model = build_model(config_from_hf(hf_config))
    with pytest.raises(ValueError, match="no classification head"):
        model(torch.ones(1, 3, dtype=torch.long))
