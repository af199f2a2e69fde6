"""benchmarks/gpu.py runs end to end (tiny shapes, on the CPU) and reports every row it
promises; on a GPU the same command with full shapes fills docs/performance.md. Timing is
never asserted."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT


def test_the_gpu_benchmark_runs_every_part_and_writes_its_rows(tmp_path):
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--quick", "--device", "cpu",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())
    for key in ["peak_tflops", "loss_over_cross_entropy", "seq2seq_base_vaswani_mfu",
                "seq2seq_big_vs_torch", "lm_vaswani_tok_s", "decode_b1_vaswani engine_tok_s",
                "decode_b32_vaswani engine_tok_s"]:
        assert key in results and results[key] > 0, key
    assert "no native bf16 here" in r.stdout or results["dtype"] == "torch.bfloat16"


@pytest.mark.slow
def test_compiled_rows_run_compiled_graphs_and_the_flops_come_after(tmp_path):
    """With --compile every contender runs eager and compiled; each compiled one compiled
    graphs in its warm-up (dynamo's counter, in the JSON). Counting the FLOPs under
    FlopCounterMode first, as the benchmark did, made torch.compile skip vaswani's frames
    for the rest of the process: 0 graphs. The eager backend keeps this to seconds."""
    out = tmp_path / "gpu.json"
    r = subprocess.run([sys.executable, "-m", "benchmarks.gpu", "--quick", "--device", "cpu",
                        "--only", "seq2seq", "lm", "--compile", "--compile-backend", "eager",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    results = json.loads(out.read_text())
    graphs = {**results["seq2seq_big_compiled_graphs"], **results["lm_compiled_graphs"]}
    assert set(graphs) >= {"vaswani compiled", "torch.nn.Transformer compiled"}, graphs
    assert all(n > 0 for n in graphs.values()), graphs
    assert "WARNING" not in r.stdout
    for key in ("seq2seq_base_vaswani compiled_mfu", "seq2seq_base_vaswani_mfu",
                "seq2seq_big_compiled_vs_torch", "seq2seq_big_vs_torch",
                "lm_vaswani compiled_tok_s"):
        assert results[key] > 0, key
