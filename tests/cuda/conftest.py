"""What only a GPU shows. Every test here needs CUDA and skips, saying so, without it; run
them with `pytest tests/cuda` on a machine with a GPU (or `pytest --device cuda`, which also
runs the model, generation, engine, training and serve tests there)."""

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (this PyTorch sees none)")
    for item in items:
        if "tests/cuda/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(skip)
