"""Phi-3 (vaswani/architectures/phi3.py) against transformers' ``Phi3ForCausalLM``: q, k and
v in one projection, gate and up in another, grouped-query attention, and a sliding window
over every layer shorter than the tokens tested (checks.py says what is
checked)."""

from .checks import SIZES, Checks, random_model


class TestPhi3(Checks):
    architecture = "phi3"
    no_peft = "peft adapts Phi-3's fused projections whole; vaswani's adapters export merged"

    @staticmethod
    def build(transformers):
        return random_model(transformers, "Phi3ForCausalLM", transformers.Phi3Config(
            **SIZES, original_max_position_embeddings=256, sliding_window=12,
            tie_word_embeddings=False))
