"""Phi-3 (vaswani/architectures/phi3.py) against transformers' ``Phi3ForCausalLM``: q, k and
v in one projection, gate and up in another, grouped-query attention, and a sliding window
over every layer shorter than the tokens tested (checks.py says what is
checked)."""

from .checks import VOCAB, Checks, random_model


class TestPhi3(Checks):
    architecture = "phi3"
    no_peft = "peft adapts Phi-3's fused projections whole; vaswani's adapters export merged"

    @staticmethod
    def build(transformers):
        return random_model(transformers, "Phi3ForCausalLM", transformers.Phi3Config(
            vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
            num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=256,
            original_max_position_embeddings=256, sliding_window=12, rms_norm_eps=1e-5,
            tie_word_embeddings=False, bos_token_id=0, eos_token_id=0, pad_token_id=0))
