"""experiments/compiled_rows.py: a step of R rows timed with the run's package and eagerly,
on equal logits (timing is never asserted)."""

import json

import pytest

from experiments import compiled_rows
from tests.conftest import DEVICE
from tests.engine.test_compiled import lm_run  # noqa: F401  (the small LM, its package built)
from vaswani import load

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU's compiled step")


def test_the_step_due_is_timed_with_the_package_and_eagerly(lm_run):  # noqa: F811
    """Each round calls the package once and the eager step once (not the package), over the
    same rows, and the two give the same logits within float32's rounding."""
    run = load(lm_run, compiled=True)
    step, calls = run.compiled, []

    class Counted:  # the runner's calls, by their rows
        max_rows = step.max_rows

        def rows(self, cache, ids, *args):
            calls.append(len(ids))
            return step.rows(cache, ids, *args)

    run.compiled = Counted()
    one = compiled_rows.time_rows(run, 3, rounds=2)
    assert one["rows"] == 3 and one["compiled_ms"] > 0 and one["eager_ms"] > 0
    # the setup's 3 decoding steps, 2 timed rounds and the logits' comparison: 6 calls
    assert calls == [3] * 6
    assert one["largest_logit_difference"] < 1e-3


def test_the_command_writes_each_steps_figures(lm_run, tmp_path):  # noqa: F811
    out = tmp_path / "rows.json"
    result = compiled_rows.main([str(lm_run), "--rows", "2,4", "--rounds", "1",
                                 "--json", str(out)])
    assert json.loads(out.read_text())["steps"] == result["steps"]
    assert [s["rows"] for s in result["steps"]] == [2, 4]
