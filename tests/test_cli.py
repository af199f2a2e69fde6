import subprocess
import sys
from pathlib import Path

from vaswani.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_summary_counts_parameters(capsys):
    assert main(["summary", str(ROOT / "configs/copy-task.toml"),
                 "--set", "model.vocab_size=14"]) == 0
    out = capsys.readouterr().out
    assert "EncoderDecoder" in out and "total" in out
    assert main(["summary", str(ROOT / "configs/copy-task.toml")]) == 2
    assert "--set model.vocab_size=N" in capsys.readouterr().err


def test_bad_config_is_a_clear_error_not_a_traceback(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model]\narch = 'decoder'\nvocab_size = 10\nd_model = 500\n")
    assert main(["summary", str(bad)]) == 2
    assert "d_model (500) must be divisible by n_heads (8)" in capsys.readouterr().err
    assert main(["summary", str(tmp_path / "missing.toml")]) == 2
    assert "config file not found" in capsys.readouterr().err


def test_module_entry_point_prints_version():
    out = subprocess.run([sys.executable, "-m", "vaswani", "--version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.startswith("vaswani ")


def test_an_os_error_from_any_command_is_one_line_not_a_traceback(monkeypatch, capsys):
    """A read-only cache, a full disk: OSError (and WriteError) end as one line, exit 2,
    whatever else main() handles besides."""
    import vaswani.cli.data as data_cli

    def read_only(args):
        raise OSError(30, "Read-only file system", "/ro/packages")

    monkeypatch.setattr(data_cli, "prepare", read_only)
    assert main(["data", "prepare", "shakespeare"]) == 2
    err = capsys.readouterr().err
    assert err == "vaswani: error: Read-only file system: /ro/packages\n"


def test_import_help_names_every_architecture_it_reads(capsys):
    """`vaswani import --help` lists each architecture of vaswani/architectures/ (and the
    llama.cpp name of each read from GGUF files): a new file there fails this until the
    help says so."""
    import pytest

    from vaswani.architectures import known

    shown = {"bert": "BERT", "gemma3": "Gemma 3", "gpt2": "GPT-2", "llama": "LLaMA",
             "mistral": "Mistral", "phi3": "Phi-3", "qwen2": "Qwen2", "qwen3": "Qwen3,",
             "qwen3_moe": "Qwen3-MoE", "smollm3": "SmolLM3"}
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name, record in known().items():
        assert shown[name] in text, name
        if record.gguf is not None:
            assert f" {record.gguf.name or name}" in text.split("gguf: a .gguf file")[1], name


def test_every_commands_help_is_printed(capsys):
    """`vaswani COMMAND --help` for every command and subcommand: argparse formats each help
    text with %, so a stray percent sign (QUANTIZE_HELP's "10% fewer") made `generate
    --help`, `translate --help` and `serve --help` fail with a TypeError."""
    import argparse

    import pytest

    from vaswani.cli import build_parser

    def commands(parser: argparse.ArgumentParser, path: list[str]):
        yield path
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield from commands(sub, [*path, name])

    found = list(commands(build_parser(), []))
    assert ["generate"] in found and ["serve"] in found and ["data", "prepare"] in found
    for path in found:
        with pytest.raises(SystemExit) as done:
            main([*path, "--help"])
        assert done.value.code == 0, path
        assert "usage: vaswani" in capsys.readouterr().out
