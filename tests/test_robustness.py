"""scripts/robustness.py: the modern English-Spanish set, and the table over it."""

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import robustness  # noqa: E402  (scripts/ is not a package)


def test_the_modern_set_is_79_distinct_pairs_and_a_bad_line_names_its_place(tmp_path):
    pairs = robustness.modern_pairs()
    assert len(pairs) == 79 == len({s for s, _ in pairs})
    assert all(s.strip() and t.strip() and s != t for s, t in pairs)
    bad = tmp_path / "bad.tsv"
    bad.write_text("One.\tUno.\nTwo. Dos.\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.tsv:2: expected 'english<TAB>spanish'"):
        robustness.modern_pairs(bad)


def test_a_repeated_trigram_is_a_loop_and_a_repeated_word_is_not():
    assert robustness.repeats_a_trigram("de la ley de la ley")
    assert not robustness.repeats_a_trigram("de la ley y de la casa")


def test_every_setting_is_scored_on_the_modern_set_and_the_test_verses(tmp_path, monkeypatch):
    from tests.training.fixtures import config, reverse_task
    from vaswani.training.train import Launch, train

    data = reverse_task(tmp_path / "pairs.tsv", n=60)
    test = reverse_task(tmp_path / "test.tsv", n=8, seed=1)
    cfg = config(tmp_path / "c.toml", "encoder-decoder", data, data={"test": str(test)},
                 train={"max_steps": 2, "metric_examples": 0, "best_metric": "valid_loss"})
    run_dir = tmp_path / "run"
    train(str(cfg), [], out=str(run_dir), launch=Launch(progress=False))
    out = tmp_path / "r.json"
    monkeypatch.setattr(sys, "argv", ["robustness.py", str(run_dir), "--limit", "4",
                                      "--beam", "2", "--json", str(out)])
    robustness.main()
    report = json.loads(out.read_text())
    assert report["modern_sentences"] == 79 and report["test_sentences"] == 4
    assert set(report["settings"]) == set(robustness.SETTINGS)
    for result in report["settings"].values():
        assert len(result["outputs"]) == 79
        assert 0 <= result["repeating"] <= 1 and 0 <= result["at_cap"] <= 1
        assert result["modern_bleu"] >= 0 and result["test_bleu"] >= 0
