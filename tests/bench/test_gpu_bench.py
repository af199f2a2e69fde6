"""benchmarks/gpu.py runs end to end (tiny shapes, on the CPU) and reports every row it
promises; on a GPU the same command with full shapes fills docs/performance.md. Timing is
never asserted."""

import json
import subprocess
import sys

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
