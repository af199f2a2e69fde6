"""Run directories written by an earlier vaswani (tests/fixtures/legacy, made by
tests/fixtures/make_legacy_runs.py at commit e078973) still load, give the same outputs and
resume exactly as the code that wrote them did."""

import json
import shutil
import warnings
from pathlib import Path

import pytest

import vaswani
from vaswani.training.train import Launch, train

LEGACY = Path(__file__).parent / "fixtures" / "legacy"
EXPECTED = json.loads((LEGACY / "expected.json").read_text())


@pytest.fixture()
def legacy(tmp_path, monkeypatch):
    """A scratch copy of the legacy runs, as the working directory (configs name their data
    relative to it)."""
    copy = tmp_path / "legacy"
    shutil.copytree(LEGACY, copy)
    monkeypatch.chdir(copy)
    return copy


def test_old_runs_load_and_answer_as_before(legacy):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no truncation or other warnings either
        run = vaswani.load("translation")
        assert run.translate(["abcde", "fedcba", ""], beam=1) == EXPECTED["translation"]["greedy"]
        beam = run.translate(["abcde", "fedcba"], beam=3, n_best=2)
        for got, want in zip(beam, EXPECTED["translation"]["beam"], strict=True):
            assert [h for h, _ in got] == [h for h, _ in want]
            assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)
        lm = vaswani.load("lm")
        assert lm.generate("to be", max_new_tokens=12, temperature=0) == \
            EXPECTED["lm"]["generate"]
        assert lm.generate("to be", max_new_tokens=12, seed=1, top_k=5) == \
            EXPECTED["lm"]["sampled"]
        clf = vaswani.load("classifier")
        got = clf.classify(["a good b", "bad c c"])
        assert [label for label, _ in got] == [x[0] for x in EXPECTED["classifier"]["classify"]]
        assert [p for _, p in got] == pytest.approx(
            [x[1] for x in EXPECTED["classifier"]["classify"]], abs=1e-5)


@pytest.mark.parametrize("family", ["translation", "lm", "classifier"])
def test_old_runs_resume_exactly(legacy, family):
    # on the CPU they were written on: a GPU's kernels round differently
    train(None, ["train.max_steps=25", "train.device=cpu"], resume=family,
          launch=Launch(progress=False), cache=legacy / "cache")
    rows = [json.loads(x) for x in (legacy / family / "metrics.jsonl").read_text().splitlines()]
    resumed = {str(r["step"]): r["loss"] for r in rows if r["step"] > 20}
    want = EXPECTED[family]["resumed_losses"]
    assert sorted(resumed) == sorted(want)
    for step, loss in want.items():
        assert resumed[step] == pytest.approx(loss, rel=1e-5, abs=1e-6), step
