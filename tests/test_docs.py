"""The documentation site (mkdocs.yml, docs/): it builds with --strict, its generated reference
is complete, "Reading the Transformer" points at code, tests and pictures that exist, the
tutorials' scripts (examples/) run, and the guides' code blocks run.

Code blocks in docs/*.md follow one convention: a ```bash or ```python block runs as written
(the tests below run them, in a fresh folder that holds the repository's `configs/` and a
trained copy-task run at `runs/copy`); a ```shell block is shown, not run here (hours of
training, several machines, a synopsis with placeholders); a ```py block needs a running
server (tests/serve/test_live.py makes the same calls). A tutorial's block that includes an
example script (`--8<-- "examples/..."`) runs as that script.
"""

import argparse
import ast
import dataclasses
import os
import re
import sys
from pathlib import Path

import pytest

from tests import processes
from tests.serve.test_browser import browser, needs_chromium, requested_urls  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(DOCS / "tools"))  # the site's build code (not a package)
import mkdocs_hooks as docs_hooks  # noqa: E402

ENV = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
       "NO_MKDOCS_2_WARNING": "1"}


def blocks(page: Path, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", page.read_text(), flags=re.S)


# --- the site -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """The site, built once with --strict; returns its folder."""
    pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
    out = tmp_path_factory.mktemp("site")
    done = processes.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                          str(out)], cwd=ROOT, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    return out


def test_the_site_builds_strict_without_a_warning(site):
    home = (site / "index.html").read_text()
    assert "Reading the Transformer" in home
    for page in ["reference/cli", "reference/config", "reference/python", "changelog",
                 "source/nn/attention"]:
        assert (site / page / "index.html").exists(), page


@needs_chromium
def test_the_home_page_and_the_reading_guide_render_in_a_browser(site, browser):  # noqa: F811
    """Headless Chromium over a local server: every picture loads, nothing is asked of
    another host. VASWANI_DOCS_SCREENSHOTS=DIR keeps a screenshot of each page there
    (docs/images/site-home.png and site-reading.png were made with DIR = docs/images)."""
    import functools
    import http.server
    import threading

    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        for page, title in [("", "vaswani"), ("reading/", "Reading the Transformer")]:
            browser.get(f"{base}/{page}")
            assert title in browser.title
            images = browser.execute_script(
                "return [...document.images].map(i => [i.src, i.complete && i.naturalWidth])")
            assert all(width for _, width in images), images
            if page:
                assert len(images) >= 6
            if os.environ.get("VASWANI_DOCS_SCREENSHOTS"):
                folder = Path(os.environ["VASWANI_DOCS_SCREENSHOTS"])
                folder.mkdir(parents=True, exist_ok=True)
                browser.save_screenshot(str(folder / f"site-{page.strip('/') or 'home'}.png"))
        elsewhere = [url for url in requested_urls(browser)
                     if not url.startswith((base, "data:"))]  # data: URLs are inline
        assert not elsewhere, elsewhere
    finally:
        server.shutdown()


def test_every_page_is_in_the_navigation():
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.rglob("*.md"):
        assert str(page.relative_to(DOCS)) in nav, page


# --- the generated reference ----------------------------------------------------------------

def test_every_config_key_has_a_docstring_and_every_flag_a_help():
    assert docs_hooks.undocumented_keys() == []
    assert docs_hooks.undocumented_flags() == []


def test_the_reference_lists_every_key_and_every_flag_as_the_code_has_them():
    from vaswani.cli import build_parser
    from vaswani.config import SECTIONS, FinetuneConfig

    config = docs_hooks.config_reference()
    assert FinetuneConfig in SECTIONS.values()
    for cls in SECTIONS.values():
        assert f"## [{cls.SECTION}]" in config
        for f in dataclasses.fields(cls):
            assert f"| `{f.name}` |" in config, f"{cls.SECTION}.{f.name}"
    cli = docs_hooks.cli_reference()

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # -h, --help: every command has them
            for option in action.option_strings:
                assert f"`{option}`" in cli, f"{path} {option}"
        for name, _, sub in docs_hooks._subcommands(parser):
            assert f"`{path} {name}`" in cli
            walk(sub, f"{path} {name}")

    walk(build_parser(), "vaswani")


def test_angle_brackets_in_help_and_docstrings_stay_text():
    assert "runs/&lt;config name&gt;" in docs_hooks.cli_reference()
    assert "before &lt;eos&gt; may end" in docs_hooks.config_reference()


def test_a_field_without_a_docstring_is_found():
    @dataclasses.dataclass
    class Example:
        documented: int = 0
        """What it is."""
        bare: int = 1

    assert docs_hooks.field_docs(Example) == {"documented": "What it is."}


# --- Reading the Transformer ----------------------------------------------------------------

READING = DOCS / "reading.md"


def test_the_reading_guide_links_every_model_module_to_code_that_exists():
    text = READING.read_text()
    links = re.findall(r"\]\(source/(\w+)/(\w+)\.md#(\w+)\)", text)
    linked = set()
    for package, module, anchor in links:
        path = ROOT / "src" / "vaswani" / package / f"{module}.py"
        assert path.exists(), path
        assert anchor == "module" or anchor in docs_hooks.top_level_symbols(path), \
            f"{path.name} has no top-level {anchor}"
        linked.add(path)
    for package in ("nn", "models"):
        for path in (ROOT / "src" / "vaswani" / package).glob("*.py"):
            if path.name == "__init__.py" and not docs_hooks.top_level_symbols(path):
                continue  # imports only
            assert path in linked, f"reading.md does not walk through {path.name}"


def test_the_reading_guide_names_tests_that_exist():
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", READING.read_text())
    assert len(named) >= 15
    for file, test in named:
        functions = {n.name for n in ast.parse((ROOT / file).read_text()).body
                     if isinstance(n, ast.FunctionDef)}
        assert test in functions, f"{file}::{test}"


def test_the_reading_guide_pictures_are_the_ones_the_script_draws(copy_run, tmp_path):
    pictures = set(re.findall(r"\(images/reading/([\w-]+\.png)\)", READING.read_text()))
    assert len(pictures) >= 6
    for name in pictures:
        assert (DOCS / "images" / "reading" / name).stat().st_size > 5_000
    import reading_figures

    assert reading_figures.main([str(copy_run[0]), "--out", str(tmp_path)]) == 0
    assert {p.name for p in tmp_path.glob("*.png")} == pictures


# --- the tutorials' scripts -----------------------------------------------------------------

def run_example(cmd: list[str], cwd: Path, timeout: float = 600, **env):
    done = processes.run(cmd, cwd=cwd, env={**ENV, **env}, timeout=timeout)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    return done.stdout


def test_every_tutorial_is_an_example_script_that_its_page_includes():
    for page in (DOCS / "tutorials").glob("*.md"):
        included = re.findall(r'--8<-- "(examples/[\w.]+)"', page.read_text())
        assert len(included) == 1, page
        assert (ROOT / included[0]).exists()


@pytest.mark.slow
@pytest.mark.parametrize("script, says", [
    ("translator.sh", ['"bleu"', "wrote my-translator-attention.png"]),
    ("char_lm.sh", ['"bits_per_char"', "ROMEO:"]),
    ("classifier.sh", ['"accuracy"', '"confusion"']),
    ("finetune_smollm2.sh", ["Q: What is the capital of Spain?", '"valid_loss"']),
    ("instruct_smollm2.sh", ["question: Translate into Spanish:", "smollm2-bible:",
                             '"valid_loss"']),
    ("run_pretrained.sh", ["The capital of France is Paris.", "imported smollm2-hf",
                           "chat: "]),
])
def test_a_tutorial_script_runs(tmp_path, script, says):
    out = run_example(["bash", str(ROOT / "examples" / script)], tmp_path, STEPS="3",
                      EVAL_BATCHES="2", MAX_TOKENS="256")
    for text in says:
        assert text in out, out[-3000:]
    if script == "instruct_smollm2.sh":  # part 2: lm-eval before and after, on its runs
        lm_eval_after_instruction_tuning(tmp_path)


def lm_eval_after_instruction_tuning(folder: Path) -> None:
    import subprocess

    from tests.peer_venvs import peer_venv
    from tests.serve.test_lm_eval import LM_EVAL

    try:
        python = peer_venv("lm-eval-0.4.13", LM_EVAL)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"lm-eval could not be installed from the package index: {e}")
    out = run_example(["bash", str(ROOT / "examples" / "instruct_smollm2_lm_eval.sh")], folder,
                      ITEMS="4", LM_EVAL=str(python.parent / "lm_eval"),
                      PORT=str(processes.free_port()))
    tables = [line for line in out.splitlines() if line.startswith("|verses_es")]
    assert len(tables) == 2 and all("acc" in line for line in tables), out[-3000:]


def test_the_serving_tutorial_talks_to_the_server_with_the_openai_client(small_runs,
                                                                          tmp_path):
    run_dir, _ = small_runs["decoder"]
    out = run_example([sys.executable, str(ROOT / "examples" / "serve_openai.py"),
                       str(run_dir)], tmp_path, timeout=300)
    assert "completion:" in out and "stream:" in out and "vaswani_requests_total" in out


def test_the_export_tutorial_runs_both_engines_without_vaswani(copy_run, tmp_path):
    out = run_example([sys.executable, str(ROOT / "examples" / "export_engines.py"),
                       str(copy_run[0]), "abcdefghij", "jihgfedcba"], tmp_path, timeout=300)
    assert "CTranslate2:  ['abcdefghij', 'jihgfedcba']" in out
    assert "ONNX Runtime: ['abcdefghij', 'jihgfedcba']" in out


# --- the guides' code blocks ----------------------------------------------------------------

RUN_PAGES = sorted(p for p in DOCS.rglob("*.md")
                   if (blocks(p, "bash") or blocks(p, "python")) and "tutorials" not in p.parts)


def test_the_pages_with_code_to_run_are_known():
    assert {str(p.relative_to(DOCS)) for p in RUN_PAGES} == {
        "getting-started.md", "how-to/decoding.md", "how-to/pretrained.md",
        "reference/python.md"}


# getting-started.md trains and serves as a reader does: a minute, so `make test-slow` runs it.
@pytest.mark.parametrize("page", [
    pytest.param(p, marks=pytest.mark.slow) if p.name == "getting-started.md" else p
    for p in RUN_PAGES], ids=lambda p: str(p.relative_to(DOCS)))
def test_a_pages_code_blocks_run_as_written(page, copy_run, tmp_path, capsys):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "copy").symlink_to(copy_run[0])
    script = "".join(blocks(page, "bash"))
    if script:
        run_example(["bash", "-euo", "pipefail", "-c", script], tmp_path)
    os.chdir(tmp_path)
    try:
        namespace: dict = {}
        for block in blocks(page, "python"):
            exec(compile(block, str(page), "exec"), namespace)  # noqa: S102
    finally:
        os.chdir(ROOT)


def test_every_module_a_page_runs_with_python_m_exists():
    """`python -m NAME` in the README, docs/ and experiments/README.md names a module of this
    repository that is there (a benchmark or experiment moved or removed leaves its command
    behind otherwise; one page told how to fetch a deleted script back from git)."""
    import importlib.util

    pages = [ROOT / "README.md", ROOT / "experiments" / "README.md", *DOCS.rglob("*.md")]
    ours = ("vaswani", "benchmarks", "experiments", "scripts", "tests")
    missing = sorted({f"{page.relative_to(ROOT)}: python -m {name}"
                      for page in pages
                      for name in re.findall(r"python -m ([A-Za-z_][\w.]*)", page.read_text())
                      if name.split(".")[0] in ours and importlib.util.find_spec(name) is None})
    assert missing == []
