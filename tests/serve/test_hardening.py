"""The server against careless and hostile clients: every field is bounded at the schema, one
request's failure is its own, bodies and prompts have limits, and the Host header is checked
(no DNS rebinding from a web page to a server on this machine)."""

import asyncio
import json
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from vaswani.serve import create_app
from vaswani.serve.server import Limits


def test_one_seed_past_63_bits_among_eight_concurrent_requests_fails_alone(live):
    """Once 5 of 8, then 8 of 8 requests got 'Overflow when unpacking long long'."""
    def post(seed):
        return httpx.post(f"{live.url}/v1/completions", timeout=60, json={
            "model": "lm", "prompt": "to be", "max_tokens": 8, "temperature": 0.7,
            "seed": seed})

    seeds = [1, 2, 3, 2 ** 70, 5, 6, 7, 2 ** 63 - 1]
    for _ in range(2):
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(post, seeds))
        for seed, r in zip(seeds, answers, strict=True):
            if seed == 2 ** 70:
                assert r.status_code == 422 and r.json()["error"]["param"] == "seed", r.text
            else:
                assert r.status_code == 200, r.text
                assert r.json()["choices"][0]["text"] is not None


@pytest.mark.parametrize("route, body, param", [
    ("/v1/completions", '{"model": "lm", "prompt": "Hi \\ud800 x"}', "prompt"),
    ("/v1/translate", '{"model": "copy", "input": ["ab", "\\udfff"]}', "input"),
    ("/v1/chat/completions",
     '{"model": "llama", "messages": [{"role": "user", "content": "a\\ud83d"}]}', "messages"),
    ("/v1/completions", '{"model": "lm", "prompt": "a", "stop": "\\ud800"}', "stop"),
])
def test_a_lone_surrogate_is_a_4xx_naming_the_field(client, route, body, param):
    response = client.post(route, content=body.encode(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["param"] == param and "lone surrogate" in error["message"]


@pytest.mark.parametrize("field, value", [
    ("temperature", float("inf")), ("top_p", -0.5), ("max_tokens", -1), ("n", 1000),
    ("seed", -1), ("top_k", 10 ** 12), ("repetition_penalty", 0), ("min_tokens", -3),
    ("presence_penalty", 7), ("no_repeat_ngram_size", 10 ** 6)])
def test_every_numeric_field_is_bounded(client, field, value):
    body = json.dumps({"model": "lm", "prompt": "a", field: value}, allow_nan=True)
    response = client.post("/v1/completions", content=body.encode(),
                           headers={"content-type": "application/json"})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == field


def test_a_body_over_the_limit_is_refused_before_it_is_read(served):
    from fastapi.testclient import TestClient

    limit = 64 * 1024
    app = create_app(served, limits=Limits(max_body_bytes=limit))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        big = json.dumps({"model": "lm", "prompt": "a" * (2 * limit)}).encode()
        r = c.post("/v1/completions", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 413 and "over the limit of 65,536 bytes" in r.text
        read = []

        def chunks():  # no Content-Length: refused as soon as more than the limit arrived
            for _ in range(100):
                read.append(1)
                yield b" " * 16384
        r = c.post("/v1/completions", content=chunks(),
                   headers={"content-type": "application/json"})
        assert r.status_code == 413
        small = c.post("/v1/completions", json={"model": "lm", "prompt": "to", "max_tokens": 2})
        assert small.status_code == 200


def test_a_prompt_over_the_token_limit_is_a_400_naming_the_limit(served):
    from fastapi.testclient import TestClient

    app = create_app(served, limits=Limits(max_prompt_tokens=20))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        r = c.post("/v1/completions", json={"model": "lm", "prompt": "to be or not " * 20})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        assert "tokens; the limit is 20" in r.json()["error"]["message"]
        r = c.post("/v1/chat/completions", json={
            "model": "llama", "messages": [{"role": "user", "content": "abc " * 30}]})
        assert r.status_code == 400 and "the limit is 20" in r.text
        assert c.post("/v1/completions", json={"model": "lm", "prompt": "to be",
                                               "max_tokens": 2}).status_code == 200


def test_the_host_header_must_name_this_machine(served, client):
    from fastapi.testclient import TestClient

    for host in ("127.0.0.1", "localhost", "127.0.0.1:8000", "[::1]:8000"):
        assert client.get("/health", headers={"host": host}).status_code == 200, host
    rebinding = client.post("/v1/completions", headers={"host": "attacker.example"},
                            json={"model": "lm", "prompt": "to"})
    assert rebinding.status_code == 400
    with TestClient(create_app(served, allowed_hosts=["models.lan"]),
                    base_url="http://models.lan") as c:
        assert c.get("/health").status_code == 200
        assert c.get("/health", headers={"host": "127.0.0.1"}).status_code == 400


def test_serve_allows_the_loopback_names_and_its_own_host_by_default():
    from vaswani.cli.serve import allowed_hosts

    assert allowed_hosts(None, "127.0.0.1") == ["localhost", "127.0.0.1", "::1", "[::1]"]
    assert allowed_hosts(None, "10.0.0.5")[-1] == "10.0.0.5"
    assert allowed_hosts(None, "0.0.0.0") == ["localhost", "127.0.0.1", "::1", "[::1]"]
    assert allowed_hosts("a.lan, b.lan", "0.0.0.0") == ["a.lan", "b.lan"]


def test_a_batch_that_fails_is_retried_job_by_job():
    """An encoder's batcher, stepped by the server's loop: jobs that arrive together run as
    one batch; one job that fails takes only itself down."""
    from vaswani.serve.batcher import Batcher, Job
    from vaswani.serve.loop import EngineLoop

    calls = []

    def handler(jobs):
        calls.append(len(jobs))
        if any(j.payload["text"] == "boom" for j in jobs):
            raise RuntimeError("this text breaks the model")
        return [j.payload["text"].upper() for j in jobs]

    async def main():
        models = EngineLoop({}, batchers={"w": Batcher("w", {"up": handler}, max_batch=8,
                                                       max_wait_ms=50)})
        loop = asyncio.get_running_loop()
        jobs = [Job("up", (), {"text": t}, loop.create_future(), loop=loop)
                for t in ("a", "b", "boom", "c")]
        for job in jobs:
            models.submit_job("w", job)
        results = await asyncio.gather(*(j.future for j in jobs), return_exceptions=True)
        models.stop()
        return results

    results = asyncio.run(main())
    assert results[:2] == ["A", "B"] and results[3] == "C"
    assert isinstance(results[2], RuntimeError)
    assert calls[0] == 4 and calls[1:] == [1, 1, 1, 1]


@pytest.mark.parametrize("kind", ["", "text/plain", None])
def test_a_body_not_sent_as_json_is_a_415_that_says_so(client, kind):
    """Content-Type "" gave a 422 "Input should be a valid dictionary"."""
    headers = {} if kind is None else {"content-type": kind}
    r = client.post("/v1/completions", content=b'{"model": "lm", "prompt": "a"}',
                    headers=headers)
    assert r.status_code == 415
    assert "the body must be JSON, sent with Content-Type: application/json" in \
        r.json()["error"]["message"]


def test_an_input_the_model_would_cut_is_refused_not_answered_shortened(client, served):
    """/v1/translate of 20,000 characters answered 26 characters with no note of the cut; a
    text past max_len is a 400 naming its tokens and the limit (translate, classify and
    embeddings alike)."""
    for route, model in (("/v1/translate", "copy"), ("/v1/classify", "clf"),
                         ("/v1/embeddings", "bert")):
        limit = served[model].config.model.max_len
        r = client.post(route, json={"model": model, "input": ["ab", "abc " * limit]})
        assert r.status_code == 400, (route, r.text)
        message = r.json()["error"]["message"]
        assert message.startswith("input[1] is ") and f"reads at most {limit}" in message
        assert client.post(route, json={"model": model, "input": "ab"}).status_code == 200


def test_an_unknown_model_name_is_not_echoed_whole(client):
    r = client.post("/v1/completions", json={"model": "m" * 1_500_000, "prompt": "a"})
    assert r.status_code in (404, 413)
    assert len(r.text) < 1000
    r = client.post("/v1/completions", json={"model": "m" * 5000, "prompt": "a"})
    assert r.status_code == 404 and "(5,000 characters)" in r.json()["error"]["message"]


def test_a_prompt_longer_than_the_model_reads_is_refused_not_slid(client, served):
    """The library continues a prompt past max_len from its last half window (with a
    warning); a server answering that silently would answer about text it did not read."""
    limit = served["lm"].config.model.max_len
    ids = served["lm"].source_tokenizer.encode("to be or not to be " * limit)[:limit + 1]
    for body in ({"prompt": ids}, {"prompt": [ids[:3], ids]}):
        r = client.post("/v1/completions", json={"model": "lm", "max_tokens": 2, **body})
        assert r.status_code == 400 and f"reads at most {limit}" in r.json()["error"]["message"]
    r = client.post("/v1/completions", json={"model": "lm", "max_tokens": 2,
                                             "prompt": ids[:limit - 4]})
    assert r.status_code == 200
