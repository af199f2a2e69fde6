"""vaswani's decoder with LLaMA options vs Hugging Face LlamaForCausalLM on the same random
weights: RoPE, RMSNorm, SwiGLU, grouped-query attention, no biases, tied embeddings."""

import pytest
import torch
from torch.testing import assert_close

from vaswani.architectures.llama import config_from_hf
from vaswani.architectures.llama import from_hf as convert_state_dict
from vaswani.generation import generate
from vaswani.models import build_model

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")


def small_llama(tie: bool = True):
    hf_config = transformers.LlamaConfig(
        vocab_size=120, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=64,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=tie)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_config).double().eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return hf, hf_config.to_dict()


def load_ours(hf, hf_config):
    config = config_from_hf(hf_config)
    ours = build_model(config).double().eval()
    ours.load_state_dict(convert_state_dict(hf.state_dict(), config, hf_config))
    return ours


@pytest.mark.parametrize("tie", [True, False])
def test_logits_match_llama_for_causal_lm(tie):
    hf, hf_config = small_llama(tie)
    ours = load_ours(hf, hf_config)
    ids = torch.randint(3, 120, (2, 20))
    expected = hf(input_ids=ids).logits
    mask = torch.ones_like(ids, dtype=torch.bool)
    assert_close(ours(ids, mask=mask), expected)


def test_cached_greedy_generation_matches_hugging_face():
    hf, hf_config = small_llama()
    ours = load_ours(hf, hf_config)
    prompt = [5, 17, 33, 8]
    out = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False,
                      attention_mask=torch.ones(1, 4, dtype=torch.long), pad_token_id=0,
                      eos_token_id=None)
    ours_ids = generate(ours, prompt, max_new_tokens=12, temperature=0, bos_id=1)
    assert ours_ids == out[0].tolist()[4:]  # generate() returns only the new tokens
