"""`vaswani import gguf FILE` of LLaMA, Mistral and Qwen2 files written as llama.cpp's
converter writes them (Mistral as ``llama``; q and k rows permuted for both; Qwen2's q/k/v
biases), from random ``transformers`` models: the import's logits equal the original
model's, and ``transformers``' own reading of the same file agrees (so the files are written
as that converter writes them). Byte-level vocabularies split text as llama.cpp's
pre-tokenizer names say, checked against ``transformers``' reading of the GGUF tokenizer.
"""

import pytest
import torch
from torch.testing import assert_close

import vaswani
from tests.architectures import checks
from tests.architectures.checks import vocabulary
from vaswani.cli import main
from vaswani.pretrained.importer import import_checkpoint

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")
gguf = pytest.importorskip("gguf")


def write_gguf(model, arch: str, path, **options):
    return checks.write_gguf(gguf, model, arch, path, **options)


def original(family: str):
    common = dict(vocab_size=len(vocabulary()[0]), hidden_size=48, intermediate_size=80,
                  num_hidden_layers=2, num_attention_heads=6, num_key_value_heads=2,
                  max_position_embeddings=128, rms_norm_eps=1e-5, bos_token_id=0,
                  eos_token_id=0)
    config = {"llama": transformers.LlamaConfig(**common, tie_word_embeddings=False),
              "mistral": transformers.MistralConfig(**common, sliding_window=None),
              "qwen2": transformers.Qwen2Config(**common, tie_word_embeddings=True)}[family]
    cls = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
           "qwen2": "Qwen2ForCausalLM"}[family]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config).eval()
    with torch.no_grad():  # norms and biases away from their 1/0 init, so they are tested
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return model


def transformers_reading(path, arch: str):
    """transformers' own reading of a GGUF file's tensors (its name map, its undoing of the
    permutation) into a fresh model of the file's architecture."""
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    torch.manual_seed(1)
    model = type(original(arch))(original(arch).config).eval()
    read = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    missing, unexpected = model.load_state_dict(read, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen2"])
def test_a_converters_file_imports_with_the_original_models_logits(tmp_path, family):
    model = original(family)
    arch = "qwen2" if family == "qwen2" else "llama"  # the converter writes Mistral as llama
    path = write_gguf(model, arch, tmp_path / "m.gguf")
    ids = torch.randint(1, model.config.vocab_size, (2, 24))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        assert_close(transformers_reading(path, arch)(input_ids=ids).logits, expected,
                     atol=1e-5, rtol=1e-5)  # the file is as the converter writes it
    run = vaswani.load(import_checkpoint("gguf", str(path), tmp_path / "run", tmp_path / "c"))
    assert bool(run.config.model.qkv_bias) == (family == "qwen2")
    with torch.no_grad():
        got = run.model(ids, mask=torch.ones_like(ids, dtype=torch.bool))
    assert_close(got, expected, atol=1e-5, rtol=1e-5)


TEXTS = ["1234567 12 3", "ab 1234 ab", "IT'S it's 'S", "a\n\n\nb   ab", "x  1  22  333"]


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2"])
def test_byte_level_vocabularies_split_text_as_their_pre_tokenizer_says(tmp_path, pre):
    from vaswani.pretrained.gguf import build_tokenizer, read_gguf

    write_gguf(original("llama"), "llama", tmp_path / "m.gguf", pre=pre)
    fields = read_gguf(tmp_path / "m.gguf")[2]
    ours = build_tokenizer(fields)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path, gguf_file="m.gguf")
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=False).ids == \
            theirs(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ours.encode(text).ids) == text
    if pre != "default":  # these texts tell the splits apart: GPT-2's gives other ids
        gpt2 = build_tokenizer({**fields, "pre": "default"})
        assert any(gpt2.encode(t).ids != ours.encode(t).ids for t in TEXTS)


@pytest.mark.parametrize("change, named", [
    ({"pre": "made-up"}, "tokenizer.ggml.pre = 'made-up' is not supported"),
    ({"rotated": 4}, "llama.rope.dimension_count = 4 rotates part of each 8-wide head")])
def test_what_vaswani_cannot_do_is_refused_by_name(tmp_path, capsys, change, named):
    write_gguf(original("llama"), "llama", tmp_path / "m.gguf", **change)
    assert main(["import", "gguf", str(tmp_path / "m.gguf"), "--out", str(tmp_path / "r")]) == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
