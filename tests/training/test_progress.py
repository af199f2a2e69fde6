"""What training shows: a bar against the budget or the steps, plain lines without a bar,
and a decaying schedule (cosine, wsd) that follows a time budget."""

import io
import json

import pytest

from tests.training.fixtures import config, text_file
from vaswani.training.progress import Progress
from vaswani.training.train import Launch, train


def test_a_budget_bar_counts_seconds_and_its_eta_is_the_time_left():
    out = io.StringIO()
    p = Progress(max_steps=100_000, budget_s=600, start_step=0, start_elapsed=0.0, bar=True,
                 lines=True, stream=out)
    p.update(50, 120.0, loss="2.0")
    assert p.bar.total == 600 and p.bar.n == 120  # not 50 of 100,000 steps
    assert p.eta(50, 120.0) == 480.0  # the budget ends first
    p.close()
    text = out.getvalue()
    assert "10-minute budget" in text and "100000" not in text


def test_steps_bar_eta_follows_the_speed_so_far():
    p = Progress(max_steps=1000, budget_s=0, start_step=200, start_elapsed=100.0, bar=False,
                 lines=False)
    p.update(300, 150.0)  # 100 steps in 50 s since this process started
    assert p.eta(300, 150.0) == 350.0  # 700 steps left at 0.5 s each
    assert "step 300/1000 (30%)" in p.line(300, 150.0)


def test_without_a_bar_a_line_is_printed_every_so_often():
    out = io.StringIO()
    p = Progress(max_steps=100, budget_s=0, start_step=0, start_elapsed=0.0, bar=False,
                 lines=True, every=0.0, stream=out)
    p.update(10, 5.0)  # between log lines: nothing to say
    p.update(20, 10.0, loss="1.5000")
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("vaswani train: step 20/100 (20%), loss 1.5000")
    assert "ETA 0:40" in lines[0]


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_a_time_budget_shapes_a_decaying_schedule(schedule, tmp_path, capsys):
    """Steps that take 0.1 s (a slow data loader stands in for a slow machine): a 0.12-minute
    budget reaches ~70 of 100,000 planned steps, and the rate decays over those instead of
    staying at its peak. (The schedule is re-planned from step 20 on: the budget leaves
    room for 20 steps at three times their unloaded time, as on a busy CI machine.)"""
    import time

    from vaswani.training import loop

    data = text_file(tmp_path / "t.txt")
    cfg = config(tmp_path / "c.toml", "decoder", data,
                 train={"max_steps": 100_000, "max_minutes": 0.12, "schedule": schedule,
                        "warmup": 5, "eval_every": 100_000, "save_every": 100_000,
                        "metric_examples": 0, "log_every": 5})
    original = loop.Trainer.train_step

    def slow_step(self):
        time.sleep(0.1)
        return original(self)

    loop.Trainer.train_step = slow_step
    try:
        train(str(cfg), [], out=str(tmp_path / "run"), launch=Launch(progress=False))
    finally:
        loop.Trainer.train_step = original
    assert f"the {schedule} schedule now decays over the steps the budget reaches" in \
        capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "run/metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["step"] < 100
    assert last["schedule_steps"] < 200
    assert last["lr"] < 0.25 * 1e-3  # near the floor at the end, not still at the peak
