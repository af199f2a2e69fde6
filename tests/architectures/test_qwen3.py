"""Qwen3 (vaswani/architectures/qwen3.py) against transformers' ``Qwen3ForCausalLM``:
norms on each head's queries and keys, heads wider than hidden / heads, grouped-query
attention, untied head (checks.py says what is checked)."""

from .checks import VOCAB, Checks, random_model


class TestQwen3(Checks):
    architecture = "qwen3"

    @staticmethod
    def build(transformers):
        return random_model(transformers, "Qwen3ForCausalLM", transformers.Qwen3Config(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, head_dim=16,
            max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
            bos_token_id=0, eos_token_id=0))
