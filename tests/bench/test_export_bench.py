"""benchmarks/export.py ``--step-costs``: one sentence given R times to each engine, vaswani
with ``batch_size`` R and CTranslate2 with ``max_batch_size`` R examples, each call's time
over its steps (timing is never asserted: the race is faked)."""

from argparse import Namespace
from pathlib import Path

from benchmarks import export as bench


def test_step_costs_give_each_engine_r_rows_and_divide_by_the_steps(monkeypatch, capsys):
    seen = []

    def race_at_best(jobs, rounds):
        seen.append(jobs)
        rows = len(next(iter(jobs.values()))["inputs"])
        return {"vaswani": {"seconds": 0.5 + rows / 100, "outputs": ["uno dos"] * rows},
                "CTranslate2": {"seconds": 0.25, "outputs": ["uno dos"] * rows,
                                "setting": f"{rows} examples, oneDNN"}}

    monkeypatch.setattr(bench, "race_at_best", race_at_best)
    args = Namespace(step_costs="1,50", run_dir="runs/x", rounds=3)
    out = bench.step_costs(args, "one two", Path("/tmp/ct2"), 2, 99, lambda text: 10)
    for jobs, rows in zip(seen, (1, 50), strict=True):
        ours = jobs["vaswani"]
        assert ours["inputs"] == ["one two"] * rows and ours["options"]["batch_size"] == rows
        peers = [job for key, job in jobs.items() if key.startswith("CTranslate2 [")]
        assert peers and all(job["batching"] == {"max_batch_size": rows,
                                                 "batch_type": "examples"} for job in peers)
        assert all(job["options"]["max_decoding_length"] == 99 for job in peers)
    assert out["rows"]["1"]["vaswani_ms_per_step"] == 51.0  # 0.51 s over 10 steps
    assert out["rows"]["50"]["vaswani_ms_per_step"] == 100.0
    assert out["rows"]["50"]["ct2_ms_per_step"] == 25.0
    assert out["rows"]["50"]["same_outputs"] == 1.0
    assert "| 50 | 10 | 100.000 | 25.000 | 4.00x |" in capsys.readouterr().out
