"""``vaswani serve``: an HTTP API (OpenAI-compatible where that fits) and a page to use and
look inside loaded runs. The application is in app.py (FastAPI, served by uvicorn); the
runs, their engines and limits in server.py; every model's work in one thread, loop.py (an
encoder's batches: batcher.py); the page in page/ (self-contained, offline)."""

from __future__ import annotations

import json
from importlib import resources

__all__ = ["create_app", "name_runs", "standalone_explorer"]


def name_runs(run_dirs: list[str], names: list[str] | None) -> dict:
    """The model name of each run directory: ``names`` in order, then the folders' names;
    two runs under one name are an error."""
    from pathlib import Path

    names = list(names or [])
    if len(names) > len(run_dirs):
        raise ValueError(f"{len(names)} --name for {len(run_dirs)} RUN_DIRs")
    names += [Path(d).name for d in run_dirs[len(names):]]
    if len(set(names)) != len(names):
        raise ValueError(f"two runs would be served under one name ({names}); give --name")
    return dict(zip(names, run_dirs, strict=True))


def create_app(*args, **kwargs):
    """See :func:`vaswani.serve.app.create_app` (FastAPI is imported only when serving)."""
    from .app import create_app as create

    return create(*args, **kwargs)


def standalone_explorer(view: dict, title: str) -> str:
    """The attention explorer as one HTML file that works offline: the page's stylesheet and
    script inlined, ``view`` (what /v1/attention answers) embedded as data."""
    page = resources.files("vaswani.serve").joinpath("page")
    html = page.joinpath("index.html").read_text(encoding="utf-8")
    css = page.joinpath("style.css").read_text(encoding="utf-8")
    js = page.joinpath("app.js").read_text(encoding="utf-8")
    # inside <script>, "</script>" or "<!--" in a text would end or comment out the data:
    # every <, > and & is written as its JSON escape, which JavaScript reads back unchanged
    data = json.dumps({**view, "title": title})
    for char, escape in (("<", "\\u003c"), (">", "\\u003e"), ("&", "\\u0026")):
        data = data.replace(char, escape)
    html = html.replace('<link rel="stylesheet" href="/style.css">', f"<style>\n{css}</style>")
    return html.replace('<script src="/app.js"></script>',
                        f"<script>window.VASWANI_DATA = {data};</script>\n"
                        f"<script>\n{js.replace('</', '<' + chr(92) + '/')}</script>")
