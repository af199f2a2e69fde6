"""Phi-3 (vaswani/architectures/phi3.py) against transformers' ``Phi3ForCausalLM``: q, k and
v in one projection, gate and up in another, grouped-query attention, and a sliding window
over every layer shorter than the tokens tested; from a Hugging Face folder and a GGUF file,
back to Hugging Face, quantized."""

import pytest

from . import checks

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")


def phi3():
    return checks.random_model(transformers, "Phi3ForCausalLM", transformers.Phi3Config(
        vocab_size=checks.VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
        original_max_position_embeddings=256, sliding_window=12, rms_norm_eps=1e-5,
        tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    model = phi3()
    folder, run_dir = checks.imported(model, tmp_path_factory.mktemp("phi3"))
    return model, run_dir


def test_logits_equal_transformers_in_float64(imported):
    checks.logits_equal(*imported, "phi3")


def test_greedy_tokens_equal_transformers_and_the_engine(imported):
    checks.greedy_tokens_equal(*imported)


def test_export_writes_phi3_back(imported, tmp_path):
    checks.exports_back(transformers, *imported, tmp_path / "back")


def test_a_gguf_file_as_llama_cpp_writes_it(tmp_path):
    gguf = pytest.importorskip("gguf")
    checks.gguf_imports(transformers, gguf, phi3(), "phi3", tmp_path)


def test_int8_and_int4(imported):
    checks.quantized_near(imported[1])
