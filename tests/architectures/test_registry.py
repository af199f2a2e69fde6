"""The architectures' registry: every file of vaswani/architectures/ that defines one is
found by its name and by the config.json model_type it imports; a run that names none (one
trained here, or written before ``[model] architecture`` existed) is read as the
architecture its fields match, as the export always read it."""

import pytest

from vaswani import rundir
from vaswani.architectures import Refused, for_hf, known, named, of
from vaswani.config import ModelConfig

from ..test_legacy_runs import LEGACY

BUILT_IN = {"bert", "gemma3", "gpt2", "llama", "mistral", "phi3", "qwen2", "qwen3", "smollm3"}


def test_every_file_that_defines_an_architecture_is_found():
    assert BUILT_IN <= set(known())
    for name, record in known().items():
        assert record.name == name
        assert named(name) is record
        for model_type in record.hf_types:
            assert for_hf(model_type) is record


def test_an_unknown_name_or_model_type_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match="architecture \\('gpt5'\\) must be one of .*'llama'"):
        named("gpt5")
    with pytest.raises(ValueError, match="x/config.json: model_type 'mamba' is not supported; "
                                         "vaswani imports .*llama"):
        for_hf("mamba", "x/config.json")


LM = dict(arch="decoder", vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1)
LLAMA = dict(LM, norm_first=True, norm="rmsnorm", activation="swiglu", bias=False,
             positional="rope", scale_embeddings=False)


@pytest.mark.parametrize("fields, expected", [
    (dict(LM, norm_first=True), "gpt2"),
    (dict(LM, arch="encoder", n_classes=2), "bert"),
    (LLAMA, "llama"),
    (dict(LLAMA, qkv_bias=True), "qwen2"),
    (dict(LLAMA, origin="MistralForCausalLM"), "mistral"),
    (dict(LLAMA, qk_norm=True, post_norms=True, activation="geglu_tanh"), "gemma3"),
    (dict(LLAMA, architecture="mistral"), "mistral"),  # a named one is taken as named
])
def test_a_run_is_read_as_its_named_or_its_matching_architecture(fields, expected):
    assert of(ModelConfig(**fields)).name == expected


def test_a_translator_has_no_architecture():
    with pytest.raises(Refused, match="arch = 'encoder-decoder'"):
        of(ModelConfig(arch="encoder-decoder", vocab_size=50, d_model=32, n_heads=4))


def test_runs_written_before_the_field_existed_are_read_as_before():
    """tests/fixtures/legacy was written before ``[model] architecture``: its language model
    (pre-LN, LayerNorm, sinusoidal positions) is GPT-2's layout, and exports as one."""
    config = rundir.read_config(LEGACY / "lm").model
    assert config.architecture == ""
    architecture = of(config)
    assert architecture.name == "gpt2"
    architecture.refuse(config)  # nothing refused


def test_a_run_that_names_an_unknown_architecture_is_refused_when_read(tmp_path):
    """A misspelt ``[model] architecture`` is an error naming the file and the known names
    when the run is read, not a surprise at export."""
    import shutil

    run = tmp_path / "lm"
    shutil.copytree(LEGACY / "lm", run)
    config = run / "config.toml"
    config.write_text(config.read_text().replace("[model]\n", '[model]\narchitecture = "lama"\n'))
    with pytest.raises(ValueError, match=f"{config}: \\[model\\] architecture \\('lama'\\) "
                                         "must be one of .*'llama'"):
        rundir.read_config(run)
    config.write_text(config.read_text().replace('"lama"', '"gpt2"'))
    assert rundir.read_config(run).model.architecture == "gpt2"


SIZES = dict(vocab_size=50, d_model=32, n_heads=4, d_ff=64, n_layers=1)


@pytest.mark.parametrize("name", sorted(known()))
def test_an_architectures_fixed_settings_and_any_sizes_make_a_run_it_exports(name):
    """A [model] that names an architecture and gives only sizes is completed by what the
    architecture fixes, into a config its own export takes; written, it leaves them out and
    reads back the same."""
    from vaswani.architectures import fixes

    sizes = dict(SIZES, experts={"count": 2}) if name == "qwen3_moe" else SIZES
    assert "arch" in fixes(name)  # a short file lacks it: how a reader without the table
    #                             knows to refuse it rather than build the default translator
    config = ModelConfig.from_dict({"architecture": name, **sizes}, fixes)
    assert all(config.setting(option) == value for option, value in fixes(name).items())
    named(name).refuse(config)  # nothing refused
    written = config.to_dict(fixes)
    assert list(written)[0] == "architecture"
    for option in fixes(name):
        section, _, key = option.rpartition(".")
        assert key not in (written.get(section, {}) if section else written), option
    assert ModelConfig.from_dict(written, fixes) == config


def _another(option: str, value):
    """A value of ``option`` other than ``value``: another of its choices, or another number."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 8
    choices = {"arch": ["decoder", "encoder", "encoder-decoder"],
               "norm": ["layernorm", "rmsnorm"], "positional": ["rope", "learned"],
               "activation": ["swiglu", "gelu", "relu"], "scaling": ["none", "llama3"]}[option]
    return next(choice for choice in choices if choice != value)


@pytest.mark.parametrize("name", sorted(known()))
def test_an_architecture_refuses_a_run_that_changes_any_setting_it_fixes(name):
    """What an architecture fixes (left out of its runs' config.toml) is what its ``refuse``
    requires: one table, so a setting cannot be fixed in one and free in the other. Each
    fixed setting given another value is refused by name (or is no valid model at all)."""
    from vaswani.architectures import fixes

    sizes = dict(SIZES, experts={"count": 2}) if name == "qwen3_moe" else SIZES
    config = ModelConfig.from_dict({"architecture": name, **sizes}, fixes)
    refused = 0
    for option, value in fixes(name).items():
        section, dot, key = option.rpartition(".")
        other = _another(key, value)
        try:
            changed = config.replace(**({section: {key: other}} if dot else {key: other}))
        except ValueError:  # not a model: nothing to refuse
            continue
        with pytest.raises(Refused) as refusal:
            named(name).refuse(changed)
        assert refusal.value.option == option or refusal.value.option in fixes(name)
        refused += 1
    assert refused >= len(fixes(name)) // 2  # most changes make a model to refuse


def test_a_named_run_holds_only_what_varies_and_reads_as_before(tmp_path, capsys):
    """config.toml of a LLaMA run: the architecture and its sizes; a value that contradicts
    the architecture is refused by name; an older file with every setting written reads the
    same; read without the architectures' table, a short one is an error, never a default
    model; `vaswani summary` of a hand-written one builds LLaMA's layout."""
    from vaswani.architectures import fixes
    from vaswani.cli import main
    from vaswani.config import RunConfig, load_run_config

    config = ModelConfig(**LLAMA, architecture="llama")
    path = tmp_path / "config.toml"
    path.write_text(RunConfig(model=config).to_toml(fixed=fixes))
    model = path.read_text().split("[model]\n")[1].split("\n\n")[0]
    assert model.startswith('architecture = "llama"\n')
    assert "norm =" not in model and "swiglu" not in model and "\narch =" not in model
    assert load_run_config(path, fixed=fixes).model == config
    with pytest.raises(ValueError, match=r"\[model\] norm = 'layernorm': architecture 'llama' "
                                         "fixes it at 'rmsnorm'"):
        load_run_config(path, ["model.norm=layernorm"], fixed=fixes)
    with pytest.raises(ValueError, match=r"\[model.window\] size = 8: architecture 'llama' "
                                         "fixes it at 0"):
        load_run_config(path, ["model.window.size=8"], fixed=fixes)
    with pytest.raises(ValueError, match="leaves out the settings that architecture fixes: "
                                         "read the file with vaswani.rundir.read_config"):
        load_run_config(path)
    older = tmp_path / "older.toml"
    older.write_text(RunConfig(model=config).to_toml())  # every setting, as before
    assert "norm = \"rmsnorm\"" in older.read_text()
    assert load_run_config(older, fixed=fixes).model == load_run_config(older).model == config
    path.write_text('[model]\narchitecture = "llama"\nvocab_size = 50\nd_model = 32\n'
                    'n_heads = 4\nd_ff = 64\nn_layers = 1\n')
    assert main(["summary", str(path)]) == 0
    out = capsys.readouterr().out
    assert "DecoderLM (decoder)" in out
    from vaswani.models import build_model, parameter_counts
    total = parameter_counts(build_model(ModelConfig(**LLAMA), "meta"))[1]
    assert f"{total:>12,} parameters (shared" in out
