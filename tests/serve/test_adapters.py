"""A served base with LoRA adapters (inference/shared.py, engine/adapters.py): each request
is answered by the run its ``model`` names, on one copy of the base and one engine, as that
run's merged model answers alone."""

import asyncio

import pytest

import vaswani
from tests.inference.test_shared import second  # noqa: F401 (fixtures)
from tests.training.test_lora import base, lora_run  # noqa: F401
from vaswani.inference.shared import load_runs

pytest.importorskip("fastapi", reason="vaswani[serve] is not installed")


def test_a_served_base_answers_each_adapter_by_name_as_its_merged_model(  # noqa: F811
        base, lora_run, second):  # noqa: F811
    import httpx

    from vaswani.serve import create_app

    dirs = {"base": base[0], "a": lora_run, "b": second}
    app = create_app(load_runs(dirs))
    server = app.state.server
    assert server.engines["a"] is server.engines["b"] is server.engines["base"]  # one engine
    body = {"prompt": "the", "max_tokens": 10, "temperature": 0}

    async def ask() -> tuple[list, dict]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=60) as c:
            answers = await asyncio.gather(*[  # together: their rows share the engine
                c.post("/v1/completions", json={**body, "model": name})
                for name in ("a", "b", "base", "a")])
            models = (await c.get("/v1/models")).json()
        return [a.json() for a in answers], models

    try:
        answers, models = asyncio.run(ask())
    finally:
        server.close()
    assert {m["id"] for m in models["data"]} == {"base", "a", "b"}
    texts = [a["choices"][0]["text"] for a in answers]
    for text, name in zip(texts, ("a", "b", "base", "a"), strict=True):
        alone = vaswani.load(dirs[name])  # merged (a LoRA run), loaded by itself
        assert text == alone.generate("the", max_new_tokens=10, temperature=0), name
    assert texts[0] != texts[2]  # an adapter's answer is not the base's
    assert server.submitted == {"base": 1, "a": 2, "b": 1}
