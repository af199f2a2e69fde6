"""benchmarks/distributed.py (small model, two gloo processes): sharding halves what each rank
holds in parameters, gradients and optimizer state, counted from the tensors. Timing is
never asserted."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


@pytest.mark.slow
def test_fsdp_holds_half_of_ddps_training_state_per_rank(tmp_path):
    out = tmp_path / "dist.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.distributed", "--quick", "--json",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())
    n = results["parameters"]
    for rank in results["modes"]["ddp"]:  # fp32: weights, gradients, two AdamW moments
        state = rank["state_bytes"]
        assert state["parameters"] == state["gradients"] == 4 * n
        assert 8 * n <= state["optimizer"] <= 8 * n + 4 * 1000  # + a step count a tensor
    for mode in ("fsdp", "fsdp+checkpointing"):
        ratio = results["summary"][mode]["vs_ddp"]
        assert 0.49 <= ratio <= 0.52, (mode, ratio)  # 1/2, and the uneven last slices
        assert results["summary"][mode]["fits_cap"]
    assert not results["summary"]["ddp"]["fits_cap"]
    assert "| fsdp | " in r.stdout


@pytest.mark.slow
def test_fsdp_starts_with_its_slices_not_the_model(tmp_path):
    """Start-up only, the 81M-parameter decoder: FSDP builds the model on the meta device and
    each rank allocates its half, so its peak resident set at start-up is well under DDP's
    (which holds the whole model and DDP's gradient buckets). Before, every rank built the
    whole model first: 0.74x."""
    out = tmp_path / "startup.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.distributed", "--startup-only",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())
    assert results["parameters"] > 80e6
    ddp = results["modes"]["ddp"]
    for rank in results["modes"]["fsdp"]:
        assert rank["startup_peak_bytes"] < 0.6 * min(r["startup_peak_bytes"] for r in ddp)
