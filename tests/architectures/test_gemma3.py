"""Gemma 3 (vaswani/architectures/gemma3.py) whose scores are scaled by a
``query_pre_attn_scalar`` other than its head width (as the 27B model's: 168 against 128),
against transformers' ``Gemma3ForCausalLM``; exported, the scalar stays folded into q's norm
(another config, the same logits). A Gemma 3 whose scalar is its head width is tested with
the other Hugging Face folders (tests/pretrained/test_hf_import.py) and its GGUF file with
the real checkpoint (tests/pretrained/test_real_checkpoints.py)."""

from .checks import SIZES, Checks, random_model


class TestGemma3(Checks):
    architecture = "gemma3"
    no_gguf = ("llama.cpp's Gemma 3 scales scores by the head width (but for the 27B "
               "model), whatever the scalar; its file is read as that")

    @staticmethod
    def build(transformers):
        return random_model(transformers, "Gemma3ForCausalLM", transformers.Gemma3TextConfig(
            **{**SIZES, "num_hidden_layers": 4}, head_dim=16, query_pre_attn_scalar=24,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"] * 2))
