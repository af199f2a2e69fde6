"""experiments/attention_forms.py: five forms of a step's cross-attention, each the attention
(checked against float64 before any timing; timing is never asserted)."""

import json

import pytest
import torch

from experiments import attention_forms
from tests.conftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE.type != "cpu", reason="a CPU's compiled step")

SMALL = ["--rows", "7", "--beam", "2", "--heads", "2", "--head-dim", "8", "--source", "6",
         "--rounds", "1"]


def test_every_form_is_the_attention_eagerly():
    """Uncompiled, each form gives the float64 attention within float32's rounding, rows
    whose sources differ in length included (a beam that does not divide the rows too)."""
    x = attention_forms.inputs(7, 2, 2, 8, 6)
    assert x["lengths"].min() < x["lengths"].max() and x["keys"].size(0) == x["lengths"].max()
    differences = attention_forms.compare(x, attention_forms.FORMS)
    assert set(differences) == set(attention_forms.FORMS)
    assert all(d < 1e-5 for d in differences.values())


def test_a_form_that_is_not_the_attention_stops_the_experiment():
    x = attention_forms.inputs(7, 2, 2, 8, 6)
    wrong = {"sums": attention_forms.sums,
             "no mask": lambda x: attention_forms.reference(
                 {**x, "lengths": torch.full_like(x["lengths"], x["keys"].size(0))}).float()}
    with pytest.raises(SystemExit, match="'no mask' is not the attention"):
        attention_forms.compare(x, wrong)


def test_the_command_times_each_compiled_form(tmp_path, monkeypatch):
    monkeypatch.setattr(attention_forms, "CALLS", 2)
    threads = torch.get_num_threads()
    out = tmp_path / "forms.json"
    try:
        result = attention_forms.main([*SMALL, "--threads", "1", "--json", str(out)])
    finally:
        torch.set_num_threads(threads)
    assert json.loads(out.read_text()) == json.loads(json.dumps(result))
    assert list(result["forms"]) == list(attention_forms.FORMS)
    for one in result["forms"].values():
        assert one["ms"] > 0 and one["largest_difference"] < 1e-4
    assert result["forms"]["sums"]["sums_over_this"] == 1.0
    assert result["shape"] == {"rows": 7, "beam": 2, "heads": 2, "head_dim": 8, "source": 6}
