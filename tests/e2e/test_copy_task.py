"""The copy task from examples/copy_task.py: a small encoder-decoder must learn to copy."""

import importlib.util
import random
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "copy_task.py"


def load_example():
    spec = importlib.util.spec_from_file_location("copy_task", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_copy_task_reaches_99_percent_exact_match_on_fresh_strings():
    copy_task = load_example()
    model, seconds = copy_task.train(seed=0, verbose=False)
    fresh = copy_task.random_strings(random.Random(12345), 500)
    accuracy = copy_task.exact_match(model, fresh)
    print(f"copy task: {accuracy:.1%} exact match after {seconds:.0f}s of training")
    assert accuracy >= 0.99
