"""Every command of README.md runs as written.

Its ```bash blocks run in order, as one script, in a fresh folder holding the repository's
`configs/` (the first block, `make demo` / `make test`, is what CI itself runs). One change is
made, and said here: a `vaswani train` of a preset that trains for minutes (`SHORTER`) gets
`--set train.max_steps=...` appended, so the command runs, on fewer steps. Then the ```python
blocks run in that folder, on the runs the bash blocks made.
"""

import os
import re
import sys
from pathlib import Path

import pytest

from tests import processes

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SHORTER = {"configs/bbc-news.toml": "--set train.max_steps=20 --set train.eval_every=20 "
                                    "--set train.save_every=20"}


def bash_blocks(text: str) -> list[str]:
    return re.findall(r"```bash\n(.*?)```", text, flags=re.S)


def shortened(block: str) -> str:
    lines = []
    for line in block.splitlines():
        for config, extra in SHORTER.items():
            if re.match(rf"vaswani train {re.escape(config)}\b", line):
                line = f"{line} {extra}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def test_the_readme_is_one_screen_of_what_to_run():
    text = README.read_text()
    assert len(text.splitlines()) < 200
    assert bash_blocks(text)[0].split()[:2] == ["make", "demo"]


@pytest.mark.slow
def test_the_readme_runs_as_written(tmp_path, capsys):
    blocks = bash_blocks(README.read_text())
    assert len(blocks) >= 5, "the README shows a block per family, serving and export"
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    script = ("set -euo pipefail\ntrap 'kill $(jobs -p) 2> /dev/null || true' EXIT\n"
              + "".join(shortened(b) for b in blocks[1:]))  # the server is stopped however
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = processes.run(["bash", "-c", script], cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "abcdefghij" in out.splitlines()  # the copy task's translation
    assert "The capital of France is Paris" in out
    # a label and its probability (after 20 steps, not necessarily the right label)
    assert re.search(r"^(business|entertainment|politics|sports|tech)\t[01]\.\d+$", out, re.M), \
        out[-2000:]
    assert '"accuracy"' in out and '"translations"' in out and '"text"' in out
    assert (tmp_path / "copy-attention.png").stat().st_size > 10_000
    for folder in ["copy-ct2", "copy-onnx"]:
        assert (tmp_path / "exports" / folder / "vaswani_export.json").exists()

    os.chdir(tmp_path)
    try:
        namespace: dict = {}
        for block in re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S):
            exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(ROOT)
    assert namespace["logits"].shape == (2, 5, 1000)
    assert "['abcdefghij', '']" in capsys.readouterr().out


@pytest.mark.parametrize("block", ["vaswani train configs/bbc-news.toml --out runs/x",
                                   "vaswani train configs/copy-task.toml --out runs/x"])
def test_only_the_long_presets_are_shortened(block):
    assert (shortened(block) != block + "\n") == ("bbc-news" in block)


def test_the_documentation_table_links_to_pages_that_exist():
    links = re.findall(r"\]\(((?:docs/)?[\w/.-]+\.md)\)", README.read_text())
    assert links
    for link in links:
        assert (ROOT / link).exists(), link


def test_make_test_leaves_the_slow_runs_to_make_test_slow_and_ci_runs_both():
    """The README's promise: `make test` runs all but the tests marked slow, `make test-slow`
    runs those, and CI (`.ci/run`) runs both, so that no test is left out of CI."""
    import shlex
    import subprocess

    recipes = dict(re.findall(r"^([\w-]+): \$\(VENV\)/\.installed\n\t(.*)$",
                              (ROOT / "Makefile").read_text(), flags=re.M))
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert {"make test", "make test-slow"} <= {line.split("#")[0].strip() for line in ci}
    readme_run = "tests/test_readme.py::test_the_readme_runs_as_written"
    for target, picked in [("test", False), ("test-slow", True)]:
        words = shlex.split(recipes[target])
        expression = words[words.index("-m", words.index("pytest")) + 1]
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                               "-p", "no:cacheprovider", "-m", expression, readme_run],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert (readme_run in done.stdout) == picked, (target, done.stdout[-2000:])
