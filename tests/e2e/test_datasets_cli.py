"""Prepare (fake) registry datasets, train each preset briefly, use and evaluate the runs."""

import json
from pathlib import Path

import pytest

from tests.conftest import read_json_line
from tests.data.fake_packages import install
from vaswani.cli import main

ROOT = Path(__file__).resolve().parents[2]
TINY = ["train.max_steps=4", "train.eval_every=4", "train.save_every=4", "train.warmup=2",
        "train.precision=fp32", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "model.n_layers=1", "data.vocab_size=300", "train.metric_examples=4"]


@pytest.mark.parametrize("preset, dataset", [("bible-en-es", "bible-en-es"),
                                             ("shakespeare-char", "shakespeare"),
                                             ("bbc-news", "bbc-news")])
def test_prepare_train_use_and_evaluate(tmp_path, monkeypatch, capsys, preset, dataset):
    cache = install(tmp_path / "cache", monkeypatch)
    assert main(["data", "prepare", dataset, "--cache", str(cache)]) == 0
    assert f"prepared {dataset}" in capsys.readouterr().out
    assert main(["data", "prepare", dataset, "--cache", str(cache)]) == 0
    assert f"already prepared (--force to redo) {dataset}" in capsys.readouterr().out
    assert main(["data", "list", "--cache", str(cache)]) == 0
    assert "[prepared]" in capsys.readouterr().out
    run = tmp_path / "run"
    sets = [x for item in TINY for x in ("--set", item)]
    if preset == "shakespeare-char":
        sets += ["--set", "data.block_size=16", "--set", "data.batch_size=4"]
    assert main(["train", str(ROOT / f"configs/{preset}.toml"), "--out", str(run), "--cache",
                 str(cache), "--no-progress", *sets]) == 0
    capsys.readouterr()
    inputs = tmp_path / "in.txt"
    inputs.write_text("In the beginning\n\nGood morrow\n")
    if dataset == "bible-en-es":
        assert main(["translate", str(run), "--input", str(inputs), "--beam", "2"]) == 0
        assert len(capsys.readouterr().out.split("\n")[:-1]) == 3
    elif dataset == "shakespeare":
        assert main(["generate", str(run), "--prompt", "ALPHA:", "--max-new-tokens", "5",
                     "--seed", "0"]) == 0
        assert capsys.readouterr().out.startswith("ALPHA:")
    else:
        assert main(["classify", str(run), "--input", str(inputs)]) == 0
        assert len(capsys.readouterr().out.splitlines()) == 3
    assert main(["evaluate", str(run), "--split", "test", "--cache", str(cache)]) == 0
    result = read_json_line(capsys.readouterr().out)
    key = {"bible-en-es": "bleu", "shakespeare": "bits_per_char", "bbc-news": "accuracy"}[dataset]
    assert key in result
    assert json.loads((run / "last/state.json").read_text())["step"] == 4
