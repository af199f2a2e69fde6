"""Qwen3 (vaswani/architectures/qwen3.py) against transformers' ``Qwen3ForCausalLM``:
norms on each head's queries and keys, heads wider than hidden / heads, grouped-query
attention, untied head (checks.py says what is checked)."""

from .checks import SIZES, Checks, random_model


class TestQwen3(Checks):
    architecture = "qwen3"

    @staticmethod
    def build(transformers):
        return random_model(transformers, "Qwen3ForCausalLM", transformers.Qwen3Config(
            **SIZES, head_dim=16, tie_word_embeddings=False))
