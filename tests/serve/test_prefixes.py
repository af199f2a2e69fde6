"""Prefix caching behind the server (engine/prefixes.py): sixteen requests that arrive
together sharing a system prompt compute it once, as /metrics shows, and answer as a server
that keeps no prefixes does."""

import asyncio
import re

import pytest

import vaswani

pytest.importorskip("fastapi", reason="vaswani[serve] is not installed")

SYSTEM = ("You are a careful assistant. Answer in one short sentence, and say plainly when "
          "you do not know. The user writes about the weather, the sea and the hills. ")


def served(run, **options) -> tuple[list[str], dict[str, float]]:
    """The texts of sixteen completions sent at once, and the server's /metrics after."""
    import httpx

    from vaswani.serve import create_app

    app = create_app({"lm": run}, **options)

    async def ask():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=120) as c:
            answers = await asyncio.gather(*[c.post("/v1/completions", json={
                "model": "lm", "prompt": f"{SYSTEM}Question {i}: what of the hills?",
                "max_tokens": 6, "temperature": 0}) for i in range(16)])
            return answers, (await c.get("/metrics")).text

    try:
        answers, text = asyncio.run(ask())
    finally:
        app.state.server.close()
    metrics = {name: float(value) for name, value in re.findall(
        r'^(vaswani_\w+)\{model="lm"\} (\S+)$', text, re.M)}
    return [a.json()["choices"][0]["text"] for a in answers], metrics


def test_sixteen_requests_sharing_a_system_prompt_compute_it_once(small_runs, tmp_path):
    import shutil

    wide = tmp_path / "wide"  # the small model, reading 512 positions (sinusoidal: no new
    shutil.copytree(small_runs["decoder"][0], wide)  # weights)
    config = wide / "config.toml"
    config.write_text(config.read_text().replace("max_len = 64", "max_len = 512", 1))
    run = vaswani.load(wide)
    assert run.config.model.max_len == 512
    system = len(run.source_tokenizer.encode(SYSTEM))
    assert system >= 64
    texts, kept = served(run)
    again, none = served(run, prefix_cache_mb=0)
    assert texts == again
    queried = kept["vaswani_prefix_cache_queries_total"]
    hits = kept["vaswani_prefix_cache_hits_total"]
    assert queried == none["vaswani_prefix_cache_queries_total"]  # every prompt token
    assert none["vaswani_prefill_tokens_total"] <= queried  # (a last one may be decoded)
    assert kept["vaswani_prefill_tokens_total"] + hits == queried
    assert hits >= 15 * (system // 16 - 1) * 16  # the system prompt's blocks, found 15 times
    assert kept["vaswani_prefix_cache_bytes"] > 0 and none["vaswani_prefix_cache_hits_total"] == 0
