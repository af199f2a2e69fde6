import json
import shutil
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
DEVICE = torch.device("cpu")  # where model tests run: `pytest --device cuda` (default cpu)
pytest_plugins = ["pytester"]  # tests/test_suite_disk.py runs small pytest sessions


def pytest_addoption(parser):
    parser.addoption("--device", default="cpu",
                     help="run the model, generation, engine, training, serve and export "
                          "tests on this device (cpu, cuda, cuda:N); default cpu")


def pytest_configure(config):
    global DEVICE
    DEVICE = torch.device(config.getoption("--device"))
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError("--device cuda: this PyTorch sees no CUDA device")


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory, request):
    """A directory for the files one test module shares (an imported checkpoint is 0.1-1 GB),
    removed when the module's last test ends rather than at the end of the session: the
    suite's imports, exports and fine-tunes would otherwise fill a CI machine's disk."""
    path = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1])
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture(autouse=True)
def _autograd_left_on():
    """A test that turns autograd off for the process (not in a context) breaks every
    later test that trains: fail it, not them."""
    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("this test left autograd off for the process (use torch.no_grad())")


@pytest.fixture(autouse=True)
def _threads_left_as_found():
    """A test that changes torch's thread count for the process changes the arithmetic of
    every later test in it (a sum split over another number of threads rounds otherwise:
    exact-resume comparisons fail in whichever test comes next): fail it, not them."""
    threads = torch.get_num_threads()
    yield
    if torch.get_num_threads() != threads:
        left = torch.get_num_threads()
        torch.set_num_threads(threads)
        pytest.fail(f"this test left torch's thread count at {left} (it was {threads})")


@pytest.fixture
def two_threads():
    """torch's products split over two threads, as a 2-core machine runs them, for the
    checks that must hold bit for bit whatever the split (`make test`'s workers run one
    thread each, so that two of them share two cores)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


# Unit tests of these folders make their tensors with torch's factories; under
# `--device cuda` those are made on the GPU (torch.device as a context manager).
ON_DEVICE = ("nn", "models", "generation", "engine")


@pytest.fixture(autouse=True)
def _on_device(request):
    folder = Path(str(request.node.fspath)).parent.name
    if DEVICE.type == "cpu" or folder not in ON_DEVICE:
        yield
        return
    with torch.device(DEVICE):
        yield


@pytest.fixture
def on_cpu():
    """For tests of a CPU-only path (oneDNN linear, int8, the bit-trick dropout, the CPU's
    attention thresholds): their tensors are made on the CPU whatever `--device` says."""
    with torch.device("cpu"):
        yield


@pytest.fixture(scope="session")
def device() -> torch.device:
    """The device of `pytest --device` (default cpu)."""
    return DEVICE


@pytest.fixture(scope="session")
def copy_run(tmp_path_factory):
    """The copy task trained once through `vaswani train` (configs/copy-task.toml), shared by
    the tests that need a working encoder-decoder. Returns (run_dir, summary, seconds).

    Once for the whole session, not once per pytest-xdist worker (~45 s on 2 cores): the first
    worker to ask trains it under a file lock in the workers' common folder, the others wait
    for it and read it (pytest-xdist's recipe for session data). A test that changes a run
    copies it first."""
    import os
    import time

    from filelock import FileLock

    from vaswani.training.train import Launch, train

    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # this session's
    run, record = shared / "copy-run" / "copy", shared / "copy-run.json"
    with FileLock(f"{record}.lock"):
        if not record.exists():
            start = time.perf_counter()
            summary = train(str(ROOT / "configs/copy-task.toml"),
                            [f"train.device={DEVICE}", "train.compile=false"],  # as fixtures
                            out=str(run), launch=Launch(progress=False))
            record.write_text(json.dumps({"summary": summary,
                                          "seconds": time.perf_counter() - start}))
    done = json.loads(record.read_text())
    return run, done["summary"], done["seconds"]


@pytest.fixture(scope="session")
def small_runs(tmp_path_factory):
    """A tiny language model and a tiny classifier, trained for a few steps."""
    from tests.training.fixtures import classification_file, config, text_file
    from vaswani.training.train import Launch, train

    base = tmp_path_factory.mktemp("small")
    runs = {}
    for arch, maker, name in [("decoder", text_file, "text.txt"),
                              ("encoder", classification_file, "labelled.tsv")]:
        data = maker(base / name)
        cfg = config(base / f"{arch}.toml", arch, data,
                     data={"tokenizer": "bpe", "vocab_size": 300, "test": str(data)},
                     train={"max_steps": 30, "eval_every": 30})
        train(str(cfg), [], out=str(base / arch), launch=Launch(progress=False))
        runs[arch] = (base / arch, data)
    return runs


def read_json_line(text: str) -> dict:
    return json.loads(text.strip().splitlines()[-1])


def restart_peak() -> int:
    """Start this process's peak resident memory (VmHWM) again from now (Linux's clear_refs)
    and return it, in bytes: what a test then measures is what it allocated, not hidden under
    an earlier test's higher peak (which ru_maxrss, a high-water mark, keeps)."""
    from vaswani.devices import peak_resident_bytes

    Path("/proc/self/clear_refs").write_text("5")
    return peak_resident_bytes()
