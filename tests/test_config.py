import dataclasses
from pathlib import Path

import pytest

from vaswani import ModelConfig
from vaswani.config import dump_toml, load_toml


def test_round_trip_through_dict_and_toml(tmp_path):
    cfg = ModelConfig(arch="encoder", vocab_size=100, n_classes=5, d_model=64, n_heads=4,
                      n_kv_heads=2, norm_first=True, positional="learned", norm_eps=1e-12)
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    path = tmp_path / "config.toml"
    path.write_text(dump_toml({"model": cfg.to_dict()}))
    assert ModelConfig.from_dict(load_toml(path)["model"]) == cfg


def test_frozen():
    cfg = ModelConfig(vocab_size=10)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.d_model = 3


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=500, n_heads=8), r"d_model \(500\) must be divisible by n_heads \(8\)"),
    (dict(n_kv_heads=3), r"n_heads \(8\) must be divisible by n_kv_heads \(3\)"),
    (dict(dropout=1.5), r"dropout \(1.5\) must be in \[0, 1\)"),
    (dict(arch="gpt"), r"arch \('gpt'\) must be one of"),
    (dict(d_model="512"), r"d_model \('512'\) must be an integer"),
    (dict(norm_first="yes"), r"norm_first \('yes'\) must be true or false"),
    (dict(pad_id=10), r"pad_id \(10\) must be in \[0, vocab_size=10\)"),
    (dict(n_layers=0), r"n_layers \(0\) must be positive"),
    (dict(n_classes=3), r"n_classes \(3\) is only used by arch 'encoder'"),
    (dict(rope={"nope_every": 2}),
     r"\[model.rope\] nope_every \(2\) takes rotary positions away .* not 'rope'"),
    (dict(rope={"nope_every": -1}, positional="rope"),
     r"\[model.rope\] nope_every \(-1\) must not be negative"),
    (dict(experts={"count": 2, "per_token": 3}, arch="decoder"),
     r"\[model.experts\] per_token \(3\) must be between 1 and count \(2\)"),
    (dict(rope={"bse": 1.0}), r"unknown key \[model.rope\] 'bse'; did you mean 'base'"),
    (dict(window=8), r"window \(8\) must be a section, \[model.window\]"),
    (dict(share_embeddings=True, tgt_vocab_size=7),
     r"share_embeddings \(True\) needs tgt_vocab_size \(7\)"),
])
def test_bad_values_name_the_field_and_value(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{"vocab_size": 10, **kwargs})


def test_values_from_the_data_may_be_left_out_but_are_needed_to_build():
    from vaswani import build_model

    with pytest.raises(ValueError, match=r"n_classes \(None\) must be set"):
        build_model(ModelConfig(arch="encoder", vocab_size=10))
    with pytest.raises(ValueError, match=r"vocab_size \(0\) must be set"):
        build_model(ModelConfig(arch="decoder"))


def test_unknown_key_suggests_the_closest_name():
    message = r"unknown key \[model\] 'd_modle'; did you mean 'd_model'"
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_dict({"vocab_size": 10, "d_modle": 64})


def test_ints_are_accepted_for_floats_and_derived_values():
    cfg = ModelConfig(vocab_size=10, dropout=0, n_layers=3, n_decoder_layers=1)
    assert cfg.dropout == 0.0 and isinstance(cfg.dropout, float)
    assert (cfg.n_encoder_layers, cfg.n_decoder_layers) == (3, 1)
    assert cfg.tgt_vocab_size == 10 and cfg.n_kv_heads == 8 and cfg.attn_dropout == 0.0


def test_invalid_toml_names_the_file(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text("[model\n")
    with pytest.raises(ValueError, match="bad.toml: invalid TOML"):
        load_toml(path)


def test_set_parses_values_by_field_type():
    from vaswani.config import RunConfig, apply_overrides

    data = {"model": {"arch": "decoder"}}
    out = apply_overrides(data, ["train.lr=3e-4", "train.bf16=true", "train.max_steps=7",
                                 "model.n_kv_heads=none", "model.n_kv_heads=2",
                                 "data.train=a.txt,b.txt", "model.positional=learned"])
    cfg = RunConfig.from_dict(out)
    assert cfg.train.lr == 3e-4 and cfg.train.bf16 is True and cfg.train.max_steps == 7
    assert cfg.model.n_kv_heads == 2 and cfg.data.train == ("a.txt", "b.txt")
    assert cfg.model.positional == "learned"
    assert data == {"model": {"arch": "decoder"}}  # the input is not modified


@pytest.mark.parametrize("item, message", [
    ("train.lrr=1", r"unknown key \[train\] 'lrr'; did you mean 'lr'"),
    ("trian.lr=1", r"unknown key 'trian'; did you mean 'train'"),
    ("train.max_steps=ten", r"--set train.max_steps=ten: expected int"),
    ("train.bf16=maybe", r"--set train.bf16=maybe: expected bool"),
    ("lr=1", r"expected section.key=value"),
])
def test_set_errors(item, message):
    from vaswani.config import apply_overrides

    with pytest.raises(ValueError, match=message):
        apply_overrides({}, [item])


def test_literal_values_are_checked_after_set():
    from vaswani.config import RunConfig, apply_overrides

    with pytest.raises(ValueError, match=r"schedule \('linear'\) must be one of"):
        RunConfig.from_dict(apply_overrides({}, ["train.schedule=linear"]))


PRESETS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "configs").glob("*.toml"))


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_build(name):
    from pathlib import Path

    from vaswani import build_model
    from vaswani.config import load_run_config

    path = Path(__file__).resolve().parents[1] / "configs" / f"{name}.toml"
    cfg = load_run_config(path, ["model.vocab_size=100"])
    extra = {"n_classes": 5} if cfg.model.arch == "encoder" else {}
    model = build_model(cfg.model.replace(**extra))
    assert sum(p.numel() for p in model.parameters()) > 0
    assert cfg.data.dataset


def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path):
    """Notepad and some editors start a UTF-8 file with a BOM; tomllib calls it an invalid
    statement at line 1, column 1. A TSV with one is read already; a config is too."""
    from vaswani.config import load_run_config

    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[model]\narch = \"decoder\"\nd_model = 16\nn_heads = 2\n")
    assert load_run_config(path).model.d_model == 16


# An imported Gemma 3 / Llama 3.1 / Qwen3-MoE mix's [model] as vaswani wrote it before
# [model.rope], [model.window] and [model.experts] existed: every moved key, flat.
FLAT_MODEL = """
[model]
arch = "decoder"
vocab_size = 50
d_model = 16
n_heads = 2
d_ff = 32
n_layers = 4
positional = "rope"
rope_base = 500000.0
rope_scaling = "llama3"
rope_factor = 32.0
rope_low_freq_factor = 2.0
rope_high_freq_factor = 8.0
rope_original_max_len = 1024
local_rope_base = 1000.0
nope_every = 4
sliding_window = 8
global_every = 2
n_experts = 4
experts_per_token = 3
expert_d_ff = 24
renormalize_experts = true
router_aux_loss = 0.25
"""


def test_an_older_runs_flat_keys_are_read_into_their_sections(tmp_path):
    from vaswani.config import RunConfig, load_run_config

    path = tmp_path / "config.toml"
    path.write_text(FLAT_MODEL)
    model = load_run_config(path).model
    assert dataclasses.asdict(model.rope) == {
        "base": 500000.0, "scaling": "llama3", "factor": 32.0, "low_freq_factor": 2.0,
        "high_freq_factor": 8.0, "original_max_len": 1024, "local_base": 1000.0,
        "nope_every": 4}
    assert dataclasses.asdict(model.window) == {"size": 8, "global_every": 2}
    assert dataclasses.asdict(model.experts) == {
        "count": 4, "per_token": 3, "d_ff": 24, "renormalize": True, "aux_loss": 0.25}
    written = RunConfig(model=model).to_toml()  # written back: the sections, no flat key
    assert "[model.rope]\nbase = 500000.0" in written and "[model.experts]\ncount = 4" in written
    assert "rope_base" not in written and "n_experts" not in written
    path.write_text(written)
    assert load_run_config(path).model == model
    # the older names still work where a person types them: --set and replace()
    assert load_run_config(path, ["model.rope_base=7", "model.sliding_window=3"]).model \
        == model.replace(rope={"base": 7.0}, window={"size": 3})
    assert model.replace(n_experts=8, expert_d_ff=12).experts.count == 8
    path.write_text(FLAT_MODEL + "\n[model.rope]\nbase = 2.0\n")
    with pytest.raises(ValueError, match=r"\[model\] rope_base and \[model.rope\] base are the "
                                         "same setting"):
        load_run_config(path)


def test_a_section_unused_is_not_written_and_an_expert_follows_d_ff():
    plain = ModelConfig(vocab_size=10)
    assert not {"rope", "window", "experts"} & set(plain.to_dict())
    moe = ModelConfig(arch="decoder", vocab_size=10, experts={"count": 2})
    assert moe.experts.d_ff == 2048 and moe.to_dict()["experts"]["d_ff"] is None
    assert moe.replace(d_ff=64).experts.d_ff == 64  # followed: it follows again
    pinned = moe.replace(experts={"d_ff": 24})
    assert pinned.replace(d_ff=64).experts.d_ff == 24  # given: it stays


def test_set_reaches_a_sections_key():
    from vaswani.config import apply_overrides

    data = apply_overrides({"model": {"arch": "decoder"}},
                           ["model.rope.scaling=llama3", "model.experts.count=2"])
    assert data["model"] == {"arch": "decoder", "rope": {"scaling": "llama3"},
                             "experts": {"count": 2}}
    with pytest.raises(ValueError, match=r"unknown key \[model.rope\] 'bse'; did you mean"):
        apply_overrides({}, ["model.rope.bse=1"])
    with pytest.raises(ValueError, match=r"--set model.window.size=x: expected int"):
        apply_overrides({}, ["model.window.size=x"])


def test_a_sections_type_hints_are_read_once_a_class():
    """A section made (each translation call makes its decoding options) reads its fields'
    types from the class once, not by evaluating every annotation anew."""
    from vaswani.config.base import type_hints
    from vaswani.config.sections import DecodeConfig

    before = type_hints.cache_info().hits
    DecodeConfig().replace(beam=4)
    assert type_hints.cache_info().hits > before
    assert type_hints(DecodeConfig) is type_hints(DecodeConfig)
    assert type_hints(DecodeConfig)["beam"] is int
