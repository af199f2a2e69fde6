"""experiments/few_rows.py: a translation timed with and without the compiled step's
companion for a few rows, to the same translations (timing is never asserted)."""

import pytest

from experiments import few_rows
from tests.conftest import DEVICE
from tests.engine.test_compiled import mt_run  # noqa: F401  (its packages built)
from vaswani import load

pytestmark = [pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU's compiled step"),
              pytest.mark.slow]  # (its module builds a translator's two packages: a minute)


def test_each_job_is_timed_with_and_without_the_companion(mt_run):  # noqa: F811
    """"with" runs the companion's library for the steps it takes and "without" never does;
    both give the same translations, and the step keeps its rows after."""
    run = load(mt_run)
    step = run.compiled
    kept, calls = step.few_rows, []
    runner = step.few._boxed_run
    step.few._boxed_run = lambda flat: (calls.append(step.few_rows), runner(flat))[1]
    result = few_rows.time_jobs(run, ["a b c d", "e f", "g h i j k l"], rounds=1)
    assert list(result) == ["all, greedy", "all, beam 4", "longest alone, greedy",
                            "longest alone, beam 4"]
    assert all(one["same_translations"] and one["with_s"] > 0 and one["without_s"] > 0
               for one in result.values())
    assert calls and set(calls) == {kept}  # only while it took its rows
    assert step.few_rows == kept
