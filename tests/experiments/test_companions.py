"""experiments/companions.py: a translation timed with and without each of the compiled
step's companions, to the same translations (timing is never asserted)."""

import pytest

from experiments import companions
from tests.conftest import DEVICE
from tests.engine.test_compiled import mt_run  # noqa: F401  (its packages built)
from vaswani import load
from vaswani.engine.compiled import SOURCE_PARTS

pytestmark = [pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU's compiled step"),
              pytest.mark.slow]  # (its module builds a translator's packages: a minute)


def test_each_job_is_timed_with_and_without_each_companion(mt_run):  # noqa: F811
    """The few-row step's library runs only in the ways that keep it, the encoder pass's
    only in those that keep it; every way gives the same translations, and the step has
    both back after."""
    run = load(mt_run)
    step = run.compiled
    few_rows, encoder, calls = step.few_rows, step.encoder, []
    for name, package in (("few", step.few), ("encoder", step.encoder)):
        runner = package._boxed_run
        package._boxed_run = lambda flat, runner=runner, name=name: (
            calls.append((name, step.few_rows, step.encoder is not None)), runner(flat))[1]
    widths = []  # each step's keys: its runs' own, and the step's width
    for package in (step, step.few):
        runner = package._boxed_run
        package._boxed_run = lambda flat, runner=runner, parts=package.parts: (widths.append((
            step.own_widths, flat[4].numel(), [t.numel() for t in flat[-parts:]])),
            runner(flat))[1]
    result = companions.time_jobs(run, ["a b c d", "e f", "g h i j k l"], rounds=1)
    assert list(result) == ["all, greedy", "all, beam 4", "longest alone, greedy",
                            "longest alone, beam 4"]
    for one in result.values():
        assert one["same_translations"] and list(one["best_s"]) == list(companions.WAYS)
        assert one["over_with_both"]["with both"] == 1.0
    assert {rows for name, rows, _ in calls if name == "few"} == {few_rows}
    assert {kept for name, _, kept in calls if name == "encoder"} == {True}
    assert {(name, rows > 0, kept) for name, rows, kept in calls} == {
        ("few", True, True), ("few", True, False), ("encoder", True, True),
        ("encoder", False, True)}
    assert step.few_rows == few_rows and step.encoder is encoder and step.own_widths
    # at the step's width only in the way that asks it, and there every run
    assert {own for own, *_ in widths} == {True, False}
    assert all(runs == [width] * len(runs) for own, width, runs in widths if not own)
    assert {len(runs) for *_, runs in widths} == {SOURCE_PARTS, 1}  # the few-row step's one
    assert any(max(runs) < width for own, width, runs in widths if own)
