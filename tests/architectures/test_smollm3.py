"""SmolLM3 (vaswani/architectures/smollm3.py) against transformers' ``SmolLM3ForCausalLM``:
every second layer here without positions (NoPE; every fourth in the released model),
grouped-query attention, a tied head (checks.py says what is checked)."""

import pytest

from vaswani.architectures.smollm3 import nope_every

from .checks import SIZES, Checks, random_model


class TestSmolLM3(Checks):
    architecture = "smollm3"
    no_gguf = "transformers' GGUF reader, the check of how llama.cpp writes a file, has none"

    @staticmethod
    def build(transformers):
        return random_model(transformers, "SmolLM3ForCausalLM", transformers.SmolLM3Config(
            **{**SIZES, "num_hidden_layers": 4}, no_rope_layer_interval=2,
            tie_word_embeddings=True))


def test_only_every_n_th_layer_may_go_without_positions():
    assert nope_every([1, 1, 1, 0, 1, 1, 1, 0]) == 4
    assert nope_every([1, 1, 1]) == 0
    with pytest.raises(ValueError, match="no_rope_layers"):
        nope_every([1, 0, 0, 1])
