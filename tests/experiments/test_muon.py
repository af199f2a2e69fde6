import json

from experiments import muon


def test_the_muon_benchmark_times_both_iterations(tmp_path, capsys):
    out = tmp_path / "muon.json"
    muon.main(["--presets", "copy-task", "--repeats", "1", "--json", str(out)])
    r = json.loads(out.read_text())["results"]["copy-task"]
    assert r["matrices"] == 20  # q/k/v, out, two feed-forward: 2 encoder + 2 decoder layers
    assert r["bf16_ms"] > 0 and r["float32_ms"] > 0 and r["bf16_over_float32"] > 0
    assert r["shapes"] == 4
    for dtype in ("bf16", "float32"):
        assert r[f"{dtype}_iteration_stacked_ms"] > 0 and r[f"{dtype}_iteration_one_by_one_ms"] > 0
    out = capsys.readouterr().out
    assert "copy-task: bf16 / float32" in out and "4 shapes stacked" in out
