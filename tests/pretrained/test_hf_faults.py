"""A Hugging Face folder that lies or contradicts itself (pretrained/hf.py's checks): each is
refused with one line naming the field or tensor, before anything is sized by it; what
transformers itself reads one way (a tied config with its own head, an older file's
``rope_scaling`` beside ``rope_parameters``) is read that way, logits equal to transformers'."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch.testing import assert_close

import vaswani
from tests.conftest import restart_peak
from tests.pretrained.test_hf_import import hf_folder, reference
from vaswani.cli import main
from vaswani.devices import peak_resident_bytes

pytest.importorskip("transformers", reason="transformers is a test dependency")


def edited(tmp_path, family, change):
    folder = hf_folder(tmp_path / "hf", family)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **change}))
    return folder


def refused(folder, tmp_path, capsys) -> str:
    assert main(["import", "hf", str(folder), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert not (tmp_path / "run").exists()
    return err.strip().splitlines()[-1]


BAD_CONFIGS = [  # (family, a change to config.json, what the one line says)
    ("llama", {"num_attention_heads": 0}, "num_attention_heads (0) must be a whole number >= 1"),
    ("llama", {"hidden_size": "64"}, "hidden_size ('64') must be a whole number >= 1"),
    ("llama", {"num_hidden_layers": 1.5}, "num_hidden_layers (1.5) must be a whole number"),
    ("llama", {"rms_norm_eps": -1}, "rms_norm_eps (-1) must be a finite number > 0"),
    ("llama", {"num_key_value_heads": 4}, "num_attention_heads (6) must be a multiple of "
                                          "num_key_value_heads (4)"),
    ("llama", {"tie_word_embeddings": "yes"}, "tie_word_embeddings ('yes') must be true or"),
    ("llama", {"eos_token_id": 10**9}, "eos_token_id (1000000000) must be a token id"),
    ("llama", {"vocab_size": 10**12}, "vocab_size is 1000000000000, but the weights'"),
    ("llama", {"hidden_size": 64}, "hidden_size is 64, but the weights'"),
    ("llama", {"rope_scaling": [1, 2]}, "rope_scaling ([1, 2]) must be an object"),
    ("llama3", {"rope_parameters": {"rope_type": "llama3", "factor": 0, "rope_theta": 5e4,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
     "rope_parameters's factor (0) must be a finite number > 0"),
    ("llama3", {"rope_parameters": {"rope_type": "llama3", "factor": 0.5, "rope_theta": 5e4,
                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0}},
     "factor (0.5) must be >= 1"),
    ("gpt2", {"n_head": 0}, "n_head (0) must be a whole number >= 1"),
    ("gemma3", {"rope_local_base_freq": float("inf")}, "rope_local_base_freq (inf)"),
]


@pytest.mark.parametrize("family, change, says", BAD_CONFIGS,
                         ids=[f"{f}-{next(iter(c))}-{i}" for i, (f, c, _) in
                              enumerate(BAD_CONFIGS)])
def test_a_config_of_wrong_types_ranges_or_sizes_is_one_line(tmp_path, capsys, family, change,
                                                             says):
    before = restart_peak()
    line = refused(edited(tmp_path, family, change), tmp_path, capsys)
    assert says in line and line.startswith("vaswani: error: "), line
    grew = (peak_resident_bytes() - before) // 1024  # KiB
    assert grew < 500_000, f"the refusal grew the peak RSS by {grew / 1024:.0f} MiB"


def rewrite_weights(folder, change):
    path = folder / "model.safetensors"
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


LIES = [  # (what, a change to the weights, what the error names)
    ("transposed k", lambda t: t.update({"model.layers.0.self_attn.k_proj.weight":
                                         t["model.layers.0.self_attn.k_proj.weight"].t()
                                         .contiguous()}),
     "model.layers.0.self_attn.k_proj.weight has shape (48, 16), but the config's sizes give "
     "(16, 48)"),
    ("reshaped gate", lambda t: t.update({"model.layers.1.mlp.gate_proj.weight":
                                          t["model.layers.1.mlp.gate_proj.weight"]
                                          .reshape(40, 96).contiguous()}),
     "model.layers.1.mlp.gate_proj.weight has shape (40, 96)"),
    ("a NaN", lambda t: t["model.layers.0.mlp.up_proj.weight"].__setitem__((3, 4),
                                                                           float("nan")),
     "weights hold NaN or infinite values (decoder.layers.0.feed_forward.linear1.weight)"),
    ("an infinity", lambda t: t["model.layers.1.self_attn.o_proj.weight"].__setitem__(
        (0, 7), float("-inf")),
     "weights hold NaN or infinite values (decoder.layers.1.self_attn.out_proj.weight)"),
]


@pytest.mark.parametrize("what, change, says", LIES, ids=[w for w, _, _ in LIES])
def test_weights_that_lie_are_refused_by_name(tmp_path, capsys, what, change, says):
    folder = hf_folder(tmp_path / "hf", "llama")
    rewrite_weights(folder, change)
    line = refused(folder, tmp_path, capsys)
    assert says in line, line


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_a_weight_is_finite_unless_one_value_is_nan_or_infinite(dtype):
    from vaswani.pretrained.importer import finite

    t = torch.randn(64, 33).to(dtype)
    assert finite(t) and finite(t[:0])
    for bad in (float("nan"), float("inf"), float("-inf")):
        for where in [(0, 0), (63, 32), (17, 5)]:
            broken = t.clone()
            broken[where] = bad
            assert not finite(broken), (bad, where)
            assert not finite(broken.t()), (bad, where)  # a view, not contiguous


def logits_equal_transformers(folder, tmp_path, family="llama", length=20):
    assert main(["import", "hf", str(folder), "--out", str(tmp_path / "run")]) == 0
    ids = torch.randint(1, 300, (2, length))
    with torch.no_grad():
        expected = reference(folder, family).double()(input_ids=ids).logits
        got = vaswani.load(tmp_path / "run").model.double()(
            ids, mask=torch.ones_like(ids, dtype=torch.bool))
    assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_a_tied_config_with_a_head_of_its_own_reads_as_transformers_reads_it(tmp_path,
                                                                           capsys):
    """transformers uses the file's lm_head.weight, untied, where it differs from the token
    table (and says so); vaswani dropped it and its logits were off by up to 2.6."""
    folder = edited(tmp_path, "llama", {"tie_word_embeddings": True})
    assert "lm_head.weight" in load_file(str(folder / "model.safetensors"))
    logits_equal_transformers(folder, tmp_path)
    assert "used, untied, as transformers does" in capsys.readouterr().err
    assert vaswani.load(tmp_path / "run").config.model.tie_embeddings is False


def test_an_older_files_rope_scaling_is_taken_whole_as_transformers_takes_it(tmp_path):
    """Beside transformers 5's rope_parameters, an edited rope_scaling wins as a whole (it was
    merged key by key: logits 0.05 off)."""
    folder = edited(tmp_path, "llama3", {"rope_scaling": {
        "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 2.0, "high_freq_factor": 8.0,
        "original_max_position_embeddings": 16}})
    logits_equal_transformers(folder, tmp_path, "llama3", length=40)  # past the 16 rescaled


def test_a_bert_projection_that_lies_is_refused_by_name(tmp_path, capsys):
    from tests.reliability.checkpoints import bert_folder

    folder = bert_folder(tmp_path / "bert")
    name = "encoder.layer.0.attention.self.key.weight"
    rewrite_weights(folder, lambda t: t.update({name: t[name].reshape(8, 32).contiguous()}))
    assert main(["import", "bert", str(folder), "--out", str(tmp_path / "run")]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{name} has shape (8, 32), but the config's sizes give (16, 16)" in line, line
    assert not (tmp_path / "run").exists()
