"""scripts/sweep.py: a grid of configs trained under one budget, scored and tabulated."""

import json
import sys
from pathlib import Path

import pytest

from tests.training.fixtures import config, reverse_task

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import sweep  # noqa: E402  (scripts/ is not a package)


def test_the_grid_is_every_combination_named_by_its_values():
    axes = [sweep.parse_axis("train.optimizer=adamw,muon"), sweep.parse_axis("train.lr=1e-3,2e-3")]
    grid = sweep.points(axes)
    assert [sweep.point_name(p) for p in grid] == [
        "optimizer-adamw_lr-1e-3", "optimizer-adamw_lr-2e-3",
        "optimizer-muon_lr-1e-3", "optimizer-muon_lr-2e-3"]
    assert sweep.points([]) == [{}] and sweep.point_name({}) == "base"
    with pytest.raises(Exception, match="expected section.key=v1,v2"):
        sweep.parse_axis("lr=1e-3")


def test_fixed_work_turns_off_the_configs_own_time_budget():
    assert "train.max_minutes=0" in sweep.budget_sets(1500, None)
    assert "train.max_minutes=10.0" in sweep.budget_sets(None, 10.0)


def test_a_tiny_sweep_trains_scores_and_tabulates_each_point_once(tmp_path, capsys):
    data = reverse_task(tmp_path / "pairs.tsv", n=120)
    test = reverse_task(tmp_path / "test.tsv", n=20, seed=1)
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, data={"test": str(test)},
                 train={"metric_examples": 0, "best_metric": "valid_loss"})
    out, js, md = tmp_path / "sweep", tmp_path / "s.json", tmp_path / "s.md"
    args = [str(cfg), "--out", str(out), "--axis", "train.optimizer=adamw,muon", "--steps", "3",
            "--beam", "1", "--json", str(js), "--markdown", str(md)]
    sweep.main(args)
    results = json.loads(js.read_text())["results"]
    assert [r["point"] for r in results] == [{"train.optimizer": "adamw"},
                                             {"train.optimizer": "muon"}]
    for r in results:
        assert r["steps"] == 3 and r["task"] == "translation"
        assert 0 <= r["test"]["bleu"] <= 100 and r["valid_loss"] > 0
        assert "train.max_steps=3" in r["train_command"]
        assert "train.max_minutes=0" in r["train_command"]
    saved = (out / "optimizer-muon" / "config.toml").read_text()
    assert 'optimizer = "muon"' in saved
    rows = md.read_text().splitlines()
    assert rows[0] == ("| optimizer | steps | minutes | tokens/s | valid loss | test bleu "
                       "| test chrf |")
    assert [row.split(" | ")[0] for row in rows[2:]] == ["| adamw", "| muon"]
    # run again: the results are read back, nothing is trained
    stamp = (out / "optimizer-adamw" / "metrics.jsonl").stat().st_mtime_ns
    sweep.main(args)
    assert (out / "optimizer-adamw" / "metrics.jsonl").stat().st_mtime_ns == stamp
    assert capsys.readouterr().out.count("| adamw |") == 2


def test_a_sweep_that_would_drop_a_point_or_could_not_be_scored_is_refused_first(tmp_path,
                                                                                capsys):
    """--axis train.lr twice kept only the second (one point instead of two); a config with
    no test split trained every point and failed at scoring. Both are refused before any
    training."""
    data = reverse_task(tmp_path / "pairs.tsv", n=120)
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data)
    out = tmp_path / "sweep"
    with pytest.raises(SystemExit):
        sweep.main([str(cfg), "--out", str(out), "--axis", "train.lr=1e-3", "--axis",
                    "train.lr=2e-3", "--steps", "2", "--split", "valid"])
    assert "--axis train.lr is given more than once" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        sweep.main([str(cfg), "--out", str(out), "--steps", "2"])
    assert "names no [data] test files" in capsys.readouterr().err
    assert not out.exists()
