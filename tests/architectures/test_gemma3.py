"""Gemma 3 (vaswani/architectures/gemma3.py) whose scores are scaled by a
``query_pre_attn_scalar`` other than its head width (as the 27B model's: 168 against 128),
against transformers' ``Gemma3ForCausalLM``. (A Gemma 3 whose scalar is its head width is
tested with the other Hugging Face folders, tests/pretrained/test_hf_import.py.)"""

import pytest

from . import checks

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    model = checks.random_model(transformers, "Gemma3ForCausalLM", transformers.Gemma3TextConfig(
        vocab_size=checks.VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=4,
        num_attention_heads=6, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24,
        max_position_embeddings=256, rms_norm_eps=1e-5, sliding_window=8, pad_token_id=0,
        bos_token_id=0, eos_token_id=0,
        layer_types=["sliding_attention", "full_attention"] * 2))
    folder, run_dir = checks.imported(model, tmp_path_factory.mktemp("gemma3"))
    return model, run_dir


def test_logits_equal_transformers_in_float64(imported):
    checks.logits_equal(*imported, "gemma3")


def test_greedy_tokens_equal_transformers_and_the_engine(imported):
    checks.greedy_tokens_equal(*imported)


def test_export_writes_the_same_model_back(imported, tmp_path):
    """Written back with the scalar folded into q's norm: another config, the same
    logits."""
    checks.exports_back(transformers, *imported, tmp_path / "back")


def test_int8_and_int4(imported):
    checks.quantized_near(imported[1])
