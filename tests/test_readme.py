"""Every ```python block in the README runs as written. (Blocks fenced ```py need a
running `vaswani serve`; tests/serve/test_live.py makes the same client calls.)"""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run(copy_run, tmp_path, monkeypatch, capsys):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "the README should show the API"
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "copy").symlink_to(copy_run[0])  # the README's training command
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102
    assert namespace["logits"].shape == (2, 5, 1000)
    assert "['abcdefghij', '']" in capsys.readouterr().out


def test_readme_worked_training_example_runs_as_written(tmp_path):
    import os
    import subprocess
    import sys

    block = re.search(r"A worked example.*?```bash\n(.*?)```", README.read_text(), re.S).group(1)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    result = subprocess.run(["bash", "-e", "-c", block], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"steps": 400' in result.stdout
