"""Every endpoint and error path of vaswani serve, through FastAPI's test client."""

import base64
import math

import numpy as np
import pytest
import torch

from tests import conftest


def test_health_and_models(client):
    assert client.get("/health").json()["status"] == "ok"
    models = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
    assert {k: m["task"] for k, m in models.items()} == {
        "copy": "translation", "lm": "lm", "clf": "classification", "bert": "classification",
        "llama": "lm"}
    assert models["llama"]["chat"] and not models["lm"]["chat"]
    assert models["clf"]["labels"] == ["neg", "pos"] and models["bert"]["labels"] == []


def test_every_model_runs_in_one_thread_with_the_threads_it_was_given(served):
    """Engines, an encoder's batches and one-off jobs all run in the engines' thread (one
    team of OpenMP threads: serve/loop.py), with the torch threads create_app was given."""
    import asyncio
    import threading

    from fastapi.testclient import TestClient

    from vaswani.serve import create_app

    threads = torch.get_num_threads()
    with TestClient(create_app(served, threads=1), base_url="http://127.0.0.1") as c:
        server = c.app.state.server
        where = {name: asyncio.run(server.call(name, lambda: (threading.get_ident(),
                                                              torch.get_num_threads())))
                 for name in served}
        assert c.post("/v1/classify", json={"model": "clf", "input": "a good b"}).is_success
        assert c.post("/v1/completions", json={"model": "lm", "prompt": "to",
                                               "max_tokens": 2}).is_success
        assert server.loop.thread.is_alive()
        assert set(where.values()) == {(server.loop.thread.ident, 1)}, where
        engines = {n for n, r in served.items() if r.decodes}
        assert set(server.engines) == engines and len(engines) >= 2  # one thread, several
    torch.set_num_threads(threads)  # what a new thread starts with, as it was


def test_the_fast_lane_of_vaswani_serve_reaches_every_engine(served, capsys):
    from fastapi.testclient import TestClient

    from vaswani.cli import main
    from vaswani.engine.config import FAST_LANE, fast_lane_for
    from vaswani.serve import create_app

    default = fast_lane_for(conftest.DEVICE)  # FAST_LANE on a CPU, none on a GPU
    assert default == (FAST_LANE if conftest.DEVICE.type == "cpu" else 0)
    for given, lane in [(None, default), (0, 0), (8, 8)]:
        with TestClient(create_app(served, fast_lane=given), base_url="http://127.0.0.1") as c:
            engines = c.app.state.server.engines.values()
            assert {e.scheduler.fast_lane for e in engines} == {lane}
    with pytest.raises(SystemExit):
        main(["serve", "some-run", "--fast-lane", "-1"])
    assert "--fast-lane: '-1' is not a whole number >= 0" in capsys.readouterr().err


def test_the_prefix_cache_of_vaswani_serve_reaches_every_language_models_engine(served,
                                                                              capsys):
    from fastapi.testclient import TestClient

    from vaswani.cli import main
    from vaswani.serve import create_app

    for given, budget in [(None, 1 << 28), (0, 0), (64, 64 << 20)]:
        with TestClient(create_app(served, prefix_cache_mb=given),
                        base_url="http://127.0.0.1") as c:
            engines = c.app.state.server.engines
            assert {n: e.scheduler.prefixes.budget for n, e in engines.items()} == {
                n: 0 if e.seq2seq else budget for n, e in engines.items()}
    assert main(["serve", "some-run", "--prefix-cache", "1024"]) != 0
    assert "--prefix-cache (1024 MB) must be less than the engine's cache, 1024 MB" in \
        capsys.readouterr().err


def test_translate_equals_the_python_api(client, served):
    body = {"model": "copy", "input": ["abcdef", "jihgf"], "beam": 3, "n_best": 2}
    data = client.post("/v1/translate", json=body).json()["data"]
    expected = served["copy"].translate(["abcdef", "jihgf"], beam=3, n_best=2)
    for got, want in zip(data, expected, strict=True):
        assert [t["text"] for t in got["translations"]] == [t for t, _ in want]
        assert [t["score"] for t in got["translations"]] == pytest.approx([s for _, s in want])
    one = client.post("/v1/translate", json={"model": "copy", "input": "abcdefg"}).json()
    assert one["data"][0]["translations"][0]["text"] == "abcdefg"


def test_completions_equal_run_generate(client, served):
    body = {"model": "lm", "prompt": "to be", "max_tokens": 10, "temperature": 0}
    choice = client.post("/v1/completions", json=body).json()["choices"][0]
    assert choice["text"] == served["lm"].generate("to be", max_new_tokens=10, temperature=0)
    assert choice["finish_reason"] in ("length", "stop")
    several = client.post("/v1/completions", json={**body, "prompt": ["to", "or not"], "n": 2,
                                                   "temperature": 0.9, "seed": 4}).json()
    assert [c["index"] for c in several["choices"]] == [0, 1, 2, 3]
    assert several["usage"]["completion_tokens"] > 0
    seeded = served["lm"].generate("or not", max_new_tokens=10, temperature=0.9, seed=5)
    assert several["choices"][3]["text"] == seeded  # prompt 1, second choice: seed 4 + 1


def test_stop_strings_and_decoding_controls(client, served):
    body = {"model": "lm", "prompt": "to be", "max_tokens": 30, "temperature": 0}
    full = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    word = full.split()[1]
    cut = client.post("/v1/completions", json={**body, "stop": [word]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and word not in cut["text"]
    assert full.startswith(cut["text"])
    blocked = client.post("/v1/completions", json={**body, "no_repeat_ngram_size": 1}).json()
    words = blocked["choices"][0]["text"]
    assert words == served["lm"].generate("to be", max_new_tokens=30, temperature=0,
                                          no_repeat_ngram_size=1)


def test_streamed_completion_joins_to_the_whole(client):
    body = {"model": "lm", "prompt": "to be", "max_tokens": 12, "temperature": 0}
    whole = client.post("/v1/completions", json=body).json()["choices"][0]["text"]
    with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    import json

    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole
    assert chunks[-1]["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_streams_first_text_goes_out_at_once_and_the_rest_once_per_step(client,
                                                                           monkeypatch):
    """The engines' thread hands a stream's text to the server's thread once per step
    (serve/loop.py ``post``), except its first piece, which goes at once: the time to the
    first token does not wait for the rest of the step."""
    loop = client.app.state.server.loop
    texts, post = [], loop.post

    def recording(event_loop, fn, *args, now=False):
        if args and args[0][0] == "text":
            texts.append(now)
        post(event_loop, fn, *args, now=now)

    monkeypatch.setattr(loop, "post", recording)
    body = {"model": "lm", "prompt": "to be", "max_tokens": 8, "min_tokens": 8,
            "temperature": 0, "stream": True}
    with client.stream("POST", "/v1/completions", json=body) as response:
        assert [line for line in response.iter_lines() if line.startswith("data: ")]
    assert len(texts) >= 2 and texts == [True] + [False] * (len(texts) - 1)


def test_chat_uses_the_checkpoints_template_and_refuses_without_one(client, served):
    messages = [{"role": "user", "content": "abc"}]
    data = client.post("/v1/chat/completions", json={"model": "llama", "messages": messages,
                                                     "max_tokens": 5, "temperature": 0}).json()
    answer = data["choices"][0]["message"]
    prompt = "<s>user:abc</s><s>assistant:"
    assert answer == {"role": "assistant",
                      "content": served["llama"].generate(prompt, max_new_tokens=5,
                                                          temperature=0)}
    refused = client.post("/v1/chat/completions", json={"model": "lm", "messages": messages})
    assert refused.status_code == 400 and "no chat template" in refused.json()["error"]["message"]


def test_embeddings_float_and_base64_equal_run_embed(client, served):
    texts = ["abc def", "ghi"]
    expected = served["bert"].embed(texts)
    floats = client.post("/v1/embeddings", json={"model": "bert", "input": texts}).json()
    assert torch.allclose(torch.tensor([d["embedding"] for d in floats["data"]]), expected,
                          atol=1e-6)
    packed = client.post("/v1/embeddings", json={"model": "bert", "input": texts,
                                                 "encoding_format": "base64"}).json()
    vectors = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4")
               for d in packed["data"]]
    assert torch.allclose(torch.tensor(np.stack(vectors)), expected, atol=0)


def test_classify_gives_every_class(client, served):
    data = client.post("/v1/classify", json={"model": "clf", "input": ["a good b"]}).json()
    row = data["data"][0]
    assert set(row["probabilities"]) == {"neg", "pos"}
    assert math.isclose(sum(row["probabilities"].values()), 1, abs_tol=1e-5)
    assert (row["label"], pytest.approx(row["probability"], abs=1e-5)) == \
        served["clf"].classify(["a good b"])[0]
    headless = client.post("/v1/classify", json={"model": "bert", "input": "x"})
    assert headless.status_code == 400 and "no classification head" in headless.text


@pytest.mark.parametrize("model, body", [
    ("copy", {"input": "abcde"}), ("copy", {"input": "abc", "target": "abd"}),
    ("lm", {"input": "to be or"}), ("clf", {"input": "a good b"})])
def test_attention_holds_the_models_weights(client, served, model, body):
    """Rows sum to 1, masked (future) positions are 0, and the weights are those the model's
    written-out attention returns."""
    data = client.post("/v1/attention", json={"model": model, **body}).json()
    run = served[model]
    maps = run.attention(body["input"], data["target"])
    for kind, a in data["attention"].items():
        w = torch.tensor(a["weights"])  # (L, H, Tq, Tk)
        assert w.shape == maps[kind]["weights"].shape
        assert torch.allclose(w, maps[kind]["weights"], atol=6e-5)
        assert torch.allclose(w.sum(-1), torch.ones(w.shape[:-1]), atol=1e-3)
        if kind in ("decoder self-attention",) or (model == "lm"):
            assert torch.all(w.triu(1) == 0)  # causal: nothing after the query
        assert a["queries"] == maps[kind]["queries"] and a["keys"] == maps[kind]["keys"]
    assert all(p["p"] is None or 0 <= p["p"] <= 1 for p in data["probabilities"])


def test_attention_without_a_target_translates_on_the_servers_engine(copy_run):
    """A translator asked to explain an input without a target explains its own greedy
    translation, made by the server's engine: the run's offline engine (a second cache, kept
    for the server's life) is never made."""
    from fastapi.testclient import TestClient

    import vaswani
    from vaswani.serve import create_app

    run = vaswani.load(copy_run[0], device=str(conftest.DEVICE))
    with TestClient(create_app({"copy": run}), base_url="http://127.0.0.1") as c:
        data = c.post("/v1/attention", json={"model": "copy", "input": "abcde"}).json()
    assert run._engine is None
    assert data["target"] == run.translate(["abcde"], beam=1)[0]


def test_a_completions_prompt_is_tokenized_once_for_all_its_completions(client, served,
                                                                        monkeypatch):
    """The server counts the prompt's tokens (its limit) and hands those tokens to every
    completion: one encode for n completions, and the same text as each alone."""
    run = served["lm"]
    encode, calls = run.source_tokenizer.encode, []
    monkeypatch.setattr(run.source_tokenizer, "encode",
                        lambda text: calls.append(text) or encode(text))
    body = {"model": "lm", "prompt": "to be or", "max_tokens": 5, "n": 3, "temperature": 0}
    data = client.post("/v1/completions", json=body).json()
    assert calls == ["to be or"]
    monkeypatch.undo()
    alone = run.generate("to be or", max_new_tokens=5, temperature=0)
    assert [c["text"] for c in data["choices"]] == [alone] * 3


BAD = [  # (request, status, words in the message)
    (("post", "/v1/translate", {"model": "nope", "input": "x"}), 404, "unknown model 'nope'"),
    (("post", "/v1/completions", {"model": "copy", "prompt": "x"}), 400,
     "/v1/completions needs a language model"),
    (("post", "/v1/translate", {"model": "copy"}), 422, "input: Field required"),
    (("post", "/v1/translate", {"model": "copy", "input": 5}), 422, "input"),
    (("post", "/v1/translate", {"model": "copy", "input": []}), 400, "empty list"),
    (("post", "/v1/translate", {"model": "copy", "input": "  "}), 400, "empty text"),
    (("post", "/v1/translate", {"model": "copy", "input": "a" * 20_001}), 400,
     "20,001 characters; the limit is 20,000"),
    (("post", "/v1/translate", {"model": "copy", "input": ["a"] * 65}), 400,
     "65 items; the limit is 64"),
    (("post", "/v1/translate", {"model": "copy", "input": "a", "beam": 500}), 422,
     "beam: Input should be less than or equal to 128"),
    (("post", "/v1/completions", {"model": "lm", "prompt": "a", "n": 9}), 400,
     "n (9) is over the limit of 8"),
    (("post", "/v1/completions", {"model": "lm", "prompt": "a", "max_tokens": 5000}), 400,
     "max_tokens (5000) is over the limit of 2048"),
    (("post", "/v1/completions", {"model": "lm", "prompt": "a", "temperature": 3}), 422,
     "temperature"),
    (("post", "/v1/completions", {"model": "lm", "prompt": ["a", "b"], "stream": True}), 400,
     "stream with a list of prompts"),
    (("post", "/v1/attention", {"model": "lm", "input": "to " * 300}), 400,
     "/v1/attention takes at most 256"),
    (("get", "/v1/nothing", None), 404, "Not Found"),
    # a count is not a flag, nor a flag or a fraction a token id (pydantic's lax mode took them)
    (("post", "/v1/completions", {"model": "lm", "prompt": "a", "logprobs": True}), 422,
     "logprobs: Input should be a valid integer"),
    (("post", "/v1/completions", {"model": "lm", "prompt": [504.0, 3.0]}), 422,
     "a token id is a whole number written without a fraction, not 504.0 (at 0)"),
    (("post", "/v1/completions", {"model": "lm", "prompt": [True, False]}), 422,
     "not true (at 0)"),
    (("post", "/v1/completions", {"model": "lm", "prompt": "a", "max_tokens": 2.0}), 422,
     "max_tokens: Input should be a valid integer"),
    (("post", "/v1/chat/completions", {"model": "lm", "messages": [
        {"role": "user", "content": "a"}], "logprobs": 1}), 422,
     "logprobs: Input should be a valid boolean"),
    (("post", "/v1/completions", {"model": "lm", "prompt": "a", "frobnicate": 1,
                                  "wibble": 2}), 400,
     "frobnicate, wibble are not implemented by this server"),
    (("post", "/v1/completions", {"model": "lm", "prompt": "a",
                                  "stream_options": {"include_usage": True}}), 400,
     "stream_options is only allowed when stream is true"),
    (("post", "/v1/chat/completions", {"model": "llama", "messages": [
        {"role": "user", "content": "a"}], "stream_options": {"include_usage": True}}), 400,
     "stream_options is only allowed when stream is true"),
]


@pytest.mark.parametrize("request_, status, words", BAD, ids=[b[2] for b in BAD])
def test_bad_requests_get_a_4xx_that_says_what_was_wrong(client, request_, status, words):
    method, path, body = request_
    response = client.request(method.upper(), path, json=body)
    assert response.status_code == status, response.text
    assert words in response.json()["error"]["message"]


def test_malformed_json_and_the_server_stays_up(client):
    response = client.post("/v1/translate", content=b'{"model": "copy", "input": ',
                           headers={"content-type": "application/json"})
    assert response.status_code == 422 and "not valid JSON" in response.json()["error"]["message"]
    assert client.get("/health").status_code == 200


def test_an_api_key_guards_every_v1_route(served):
    from fastapi.testclient import TestClient

    from vaswani.serve import create_app

    with TestClient(create_app(served, api_key="s3cret"), base_url="http://127.0.0.1") as c:
        assert c.get("/health").json()["auth"] is True
        assert c.get("/v1/models").status_code == 401
        bad = c.post("/v1/translate", json={"model": "copy", "input": "abc"},
                     headers={"Authorization": "Bearer wrong"})
        assert bad.status_code == 401 and "API key" in bad.json()["error"]["message"]
        ok = c.post("/v1/translate", json={"model": "copy", "input": "abc"},
                    headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200
        assert c.get("/").status_code == 200  # the page itself is public; it asks for the key


def test_requests_are_answered_without_a_worker_thread(served):
    """The API-key check and the JSON routes run on the event loop: a plain-function
    dependency would send every request through one of AnyIO's worker threads first."""
    import asyncio
    import threading

    import httpx

    from vaswani.serve import create_app

    app = create_app(served, api_key="s3cret")
    key = {"Authorization": "Bearer s3cret"}

    def workers() -> set[int]:
        return {t.ident for t in threading.enumerate() if t.name == "AnyIO worker thread"}

    async def requests() -> set[int]:  # a new event loop: AnyIO's pool starts empty
        before = workers()
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://127.0.0.1", timeout=60) as c:
            answers = [await c.get("/health"), await c.get("/metrics"),
                       await c.get("/v1/models", headers=key),
                       await c.post("/v1/completions", headers=key, json={
                           "model": "lm", "prompt": "to", "max_tokens": 2}),
                       await c.post("/v1/completions", headers=key, json={
                           "model": "lm", "prompt": "to", "max_tokens": 2, "stream": True})]
            assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
            assert answers[-1].text.rstrip().endswith("data: [DONE]")
            hopped = workers() - before
            assert (await c.get("/")).status_code == 200  # the page: a plain function
            control = workers() - before  # which does run in a worker thread
        return hopped, control

    try:
        hopped, control = asyncio.run(requests())
        assert hopped == set() and control, (hopped, control)
    finally:
        app.state.server.close()


@pytest.mark.parametrize("model, route, body", [
    ("copy", "/v1/translate", {"input": "abc"}),  # an engine's queue
    ("lm", "/v1/completions", {"prompt": "to be", "n": 2}),
    ("clf", "/v1/classify", {"input": "a good b"}),  # an encoder's batcher
])
def test_a_full_queue_answers_503(client, monkeypatch, model, route, body):
    from vaswani.serve.batcher import Batcher, Busy
    from vaswani.serve.loop import EngineLoop

    def full(self, *job):  # one Busy for an engine's queue and an encoder's worker alike
        raise Busy(f"model {model!r} has 256 requests waiting; try again shortly")

    monkeypatch.setattr(Batcher, "submit", full)
    monkeypatch.setattr(EngineLoop, "submit", full)
    response = client.post(route, json={"model": model, **body})
    assert response.status_code == 503 and "try again" in response.json()["error"]["message"]


def test_the_page_and_its_files_are_served_and_local(client):
    page = client.get("/").text
    assert "<script src=\"/app.js\"></script>" in page and "http://" not in page \
        and "https://" not in page
    for path in ("/app.js", "/style.css"):
        text = client.get(path).text
        assert "http://" not in text.replace('http://www.w3.org/2000/svg', "")
        assert "https://" not in text


def test_metrics_are_prometheus_text_with_the_engines_state(client):
    from prometheus_client.parser import text_string_to_metric_families

    client.post("/v1/completions", json={"model": "lm", "prompt": "to be", "max_tokens": 5,
                                         "temperature": 0})
    client.post("/v1/translate", json={"model": "copy", "input": "abc"})
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith(
        "text/plain")
    samples = {(s.name, s.labels.get("model")): s.value
               for family in text_string_to_metric_families(response.text)
               for s in family.samples}
    assert samples[("vaswani_generated_tokens_total", "lm")] >= 5
    assert samples[("vaswani_spec_decode_drafts_total", "lm")] == 0  # nothing guessed
    assert samples[("vaswani_requests_running", "copy")] == 0
    assert samples[("vaswani_cache_slots", "copy")] > samples[("vaswani_cache_slots_used",
                                                                "copy")] == 0
    assert samples[("vaswani_cache_slot_width", "copy")] > 0
    assert samples[("vaswani_time_to_first_token_seconds_count", "lm")] >= 1
    assert samples[("vaswani_time_per_output_token_seconds_count", "lm")] >= 1
    assert ("vaswani_requests_waiting", "clf") in samples  # an encoder's queue


def test_vaswani_serve_quantize_and_kv_cache_reach_every_runs_load(monkeypatch, capsys):
    import vaswani.inference.shared
    from vaswani.cli import main

    loaded = []

    def load_runs(run_dirs, **kwargs):
        loaded.append((run_dirs, {k: v for k, v in kwargs.items() if k != "say"}))
        raise ValueError("stop before the server starts")

    monkeypatch.setattr(vaswani.inference.shared, "load_runs", load_runs)
    threads = torch.get_num_threads()
    assert main(["serve", "some-run", "--quantize", "int8", "--kv-cache", "bf16"]) != 0
    assert "stop before the server starts" in capsys.readouterr().err
    assert torch.get_num_threads() == threads  # loading sets 1; a failure set it back
    assert loaded == [({"some-run": "some-run"}, {"device": "cpu", "quantize": "int8",
                                                  "kv_cache": "bf16", "fast_prefill": None})]
    assert main(["serve", "some-run", "--quantize", "int8", "--fast-prefill"]) != 0
    assert loaded[-1][1]["fast_prefill"] is True
    assert main(["serve", "some-run", "--quantize", "int8", "--no-fast-prefill"]) != 0
    assert loaded[-1][1]["fast_prefill"] is False
    with pytest.raises(SystemExit):
        main(["serve", "some-run", "--quantize", "int2"])
    assert "invalid choice: 'int2'" in capsys.readouterr().err


def test_vaswani_serve_on_a_port_in_use_says_so_before_it_announces_anything(copy_run, capsys):
    """Before: it loaded the models, announced "serving on ...", then died of uvicorn's bind
    error (exit 3). The port is bound first, and one line says it is in use."""
    import socket

    from vaswani.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", str(copy_run[0]), "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert f"127.0.0.1:{port} is in use (another server?)" in err
    assert "vaswani serve:" not in err  # nothing announced


def test_vaswani_serve_speculate_is_every_language_models_default(served, monkeypatch):
    """--speculate reaches the language models' [decode] (not a translator's), and a
    completion served with it (guessed by a --draft) is the one served without
    (engine/speculate.py, engine/draft.py)."""
    import socket

    from fastapi.testclient import TestClient

    import vaswani.cli.serve
    import vaswani.inference.shared
    from vaswani.cli import main
    from vaswani.serve import create_app

    lm = vaswani.load(served["lm"].run_dir, device=str(conftest.DEVICE))
    runs = {"lm": lm, "copy": served["copy"]}
    monkeypatch.setattr(vaswani.inference, "load", lambda d, **kw: runs[d])  # (--draft's)
    monkeypatch.setattr(vaswani.inference.shared, "load_runs",
                        lambda dirs, **kw: {name: runs[d] for name, d in dirs.items()})
    seen = {}
    monkeypatch.setattr(vaswani.cli.serve, "_serve",
                        lambda args, sock, loaded, threads: seen.update(loaded) or 0)
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    assert main(["serve", "lm", "copy", "--speculate", "3", "--port", str(port)]) == 0
    assert seen["lm"].config.decode.speculate == 3
    assert seen["copy"].config.decode.speculate == 0
    # --draft: every language model's guesses from that run (engine/draft.py), no other's
    assert main(["serve", "lm", "copy", "--draft", "lm", "--port", str(port)]) == 0
    assert seen["lm"].draft is lm and getattr(seen["copy"], "draft", None) is None
    body = {"model": "lm", "prompt": "to be or not to be, to be or not", "max_tokens": 16,
            "temperature": 0}
    with TestClient(create_app({"lm": lm}), base_url="http://127.0.0.1") as c:
        fast = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        from prometheus_client.parser import text_string_to_metric_families

        said = {s.name: s.value for f in text_string_to_metric_families(c.get("/metrics").text)
                for s in f.samples if s.name.startswith("vaswani_spec_decode")}
        guesses = c.app.state.server.engines["lm"].speculation
        assert said == {"vaswani_spec_decode_drafts_total": guesses.passes,
                        "vaswani_spec_decode_draft_tokens_total": guesses.guessed,
                        "vaswani_spec_decode_accepted_tokens_total": guesses.accepted}
        assert guesses.passes > 0 and guesses.accepted <= guesses.guessed
    with TestClient(create_app({"lm": served["lm"]}), base_url="http://127.0.0.1") as c:
        plain = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert fast == plain
    with pytest.raises(ValueError, match="speculate"):
        lm.set_decode(speculate=99)
