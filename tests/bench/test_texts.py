"""The benchmarks' texts are frozen (benchmarks/texts/README.md): a figure measured on them
stays comparable only while they do not change."""

import hashlib
from pathlib import Path

import pytest

TEXTS = Path(__file__).resolve().parents[2] / "benchmarks" / "texts"


@pytest.mark.parametrize("name, sha256", [
    ("held-out.md", "213cb7e648cec18d052b90b7cb5ab7d0a373e7feaad9918b4cea192e9b5b4efc"),
    ("prompts.md", "a1349bbadee2469ae2192f39cdfd75248c105d4162580a7b3070a2e2b5557e05"),
])
def test_a_benchmark_text_is_the_one_its_figures_were_measured_on(name, sha256):
    assert hashlib.sha256((TEXTS / name).read_bytes()).hexdigest() == sha256, (
        f"benchmarks/texts/{name} changed: the figures measured on it are no longer "
        "comparable (benchmarks/texts/README.md says how to replace it)")
