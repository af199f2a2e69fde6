"""Qwen3 (vaswani/architectures/qwen3.py) against transformers' ``Qwen3ForCausalLM``:
norms on each head's queries and keys, heads wider than hidden / heads, grouped-query
attention, untied head; from a Hugging Face folder and a GGUF file, back to Hugging Face,
quantized."""

import pytest

from . import checks

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")


def qwen3():
    return checks.random_model(transformers, "Qwen3ForCausalLM", transformers.Qwen3Config(
        vocab_size=checks.VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, head_dim=16,
        max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=0))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    model = qwen3()
    folder, run_dir = checks.imported(model, tmp_path_factory.mktemp("qwen3"))
    return model, run_dir


def test_logits_equal_transformers_in_float64(imported):
    checks.logits_equal(*imported, "qwen3")


def test_greedy_tokens_equal_transformers_and_the_engine(imported):
    checks.greedy_tokens_equal(*imported)


def test_export_writes_qwen3_back(imported, tmp_path):
    checks.exports_back(transformers, *imported, tmp_path / "back")


def test_a_gguf_file_as_llama_cpp_writes_it(tmp_path):
    gguf = pytest.importorskip("gguf")
    checks.gguf_imports(transformers, gguf, qwen3(), "qwen3", tmp_path)


def test_int8_and_int4(imported):
    checks.quantized_near(imported[1])


def test_lora_adapters_load_in_peft(imported, tmp_path):
    checks.lora_loads_in_peft(transformers, imported[1], tmp_path)
