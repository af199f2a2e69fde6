"""Runs to serve (one of each kind) and servers: FastAPI's test client, and a real uvicorn
server on 127.0.0.1 (a free port, started and stopped by the fixture)."""

import threading
import time

import pytest

import vaswani
from tests import conftest
from tests.processes import free_port
from tests.reliability.checkpoints import CHATML, bert_folder, llama_gguf

pytest.importorskip("fastapi", reason="vaswani[serve] is not installed")


@pytest.fixture(scope="session")
def served(copy_run, small_runs, tmp_path_factory):
    """name -> loaded Run: a translator (the copy task), a language model, a classifier, an
    imported BERT (embeddings) and an imported LLaMA with a chat template."""
    from vaswani.pretrained.importer import import_bert, import_gguf

    base = tmp_path_factory.mktemp("served")
    bert = import_bert(str(bert_folder(base / "bert-src")), base / "bert", base / "cache")
    llama = import_gguf(str(llama_gguf(base / "m.gguf", chat_template=CHATML)), base / "llama",
                        base / "cache")
    dirs = {"copy": copy_run[0], "lm": small_runs["decoder"][0],
            "clf": small_runs["encoder"][0], "bert": bert, "llama": llama}
    return {name: vaswani.load(d, device=str(conftest.DEVICE)) for name, d in dirs.items()}


@pytest.fixture()
def client(served):
    from fastapi.testclient import TestClient

    from vaswani.serve import create_app

    with TestClient(create_app(served), base_url="http://127.0.0.1") as c:
        yield c


class LiveServer:
    """uvicorn serving an app in a thread, on 127.0.0.1."""

    def __init__(self, app) -> None:
        import uvicorn

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.time() + 30
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


@pytest.fixture()
def live(served):
    from vaswani.serve import create_app

    with LiveServer(create_app(served)) as server:
        yield server
