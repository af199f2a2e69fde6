"""A real uvicorn server on 127.0.0.1 driven by the official ``openai`` client and by many
concurrent clients; a client that goes away stops its generation."""

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

openai = pytest.importorskip("openai", reason="the openai client is a test dependency")


def client_for(live) -> "openai.OpenAI":
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                         timeout=60)


def test_openai_completion_equals_run_generate(live, served):
    c = client_for(live)
    got = c.completions.create(model="lm", prompt="to be", max_tokens=12, temperature=0)
    assert got.choices[0].text == served["lm"].generate("to be", max_new_tokens=12,
                                                        temperature=0)
    ids_alone = served["lm"].source_tokenizer.encode(got.choices[0].text)
    assert got.usage.completion_tokens >= len(ids_alone) - 1


def test_openai_streamed_chat_equals_the_whole_answer(live, served):
    c = client_for(live)
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "abc"}]
    whole = c.chat.completions.create(model="llama", messages=messages, max_tokens=8,
                                      temperature=0).choices[0].message.content
    pieces = [chunk.choices[0].delta.content or "" for chunk in c.chat.completions.create(
        model="llama", messages=messages, max_tokens=8, temperature=0, stream=True)]
    assert "".join(pieces) == whole
    prompt = "<s>system:be brief</s><s>user:abc</s><s>assistant:"
    assert whole == served["llama"].generate(prompt, max_new_tokens=8, temperature=0)


def test_openai_embeddings_equal_vaswani_embed(live, served, tmp_path):
    from vaswani.cli import main

    texts = ["abc def", "the quick brown fox", "x"]
    got = client_for(live).embeddings.create(model="bert", input=texts)  # base64 on the wire
    vectors = np.array([d.embedding for d in got.data], dtype=np.float32)
    (tmp_path / "in.txt").write_text("\n".join(texts) + "\n")
    assert main(["embed", str(served["bert"].run_dir), "--input", str(tmp_path / "in.txt"),
                 "--out", str(tmp_path / "e.npy")]) == 0
    assert np.array_equal(vectors, np.load(tmp_path / "e.npy"))


def test_32_concurrent_requests_answer_as_32_sequential_ones(live):
    """Batched results equal unbatched ones: translations (beam 4), greedy and seeded
    completions and classifications, 32 at once, then one by one. Texts and labels are equal;
    probabilities to 1e-4 (a padded batch sums in another order)."""
    requests = []
    for i in range(32):
        kind = i % 4
        if kind == 0:
            requests.append(("/v1/translate", {"model": "copy", "input": "abcdefgh"[: 5 + i % 4]
                                               + "ij"[i % 2], "beam": 4}))
        elif kind == 1:
            requests.append(("/v1/completions", {"model": "lm", "prompt": "to be or"[: 2 + i % 7],
                                                 "max_tokens": 8, "temperature": 0}))
        elif kind == 2:
            requests.append(("/v1/completions", {"model": "lm", "prompt": "that is", "seed": i,
                                                 "max_tokens": 8, "temperature": 0.9}))
        else:
            requests.append(("/v1/classify", {"model": "clf", "input": f"a good {i} b"}))

    def answer(request):
        path, body = request
        r = httpx.post(live.url + path, json=body, timeout=120)
        assert r.status_code == 200, r.text
        data = r.json()
        return data.get("data") if "data" in data else [c["text"] for c in data["choices"]]

    with ThreadPoolExecutor(32) as pool:
        together = list(pool.map(answer, requests))
    alone = [answer(r) for r in requests]
    for a, b in zip(together, alone, strict=True):
        if isinstance(a[0], dict) and "probabilities" in a[0]:  # classifications
            assert [x["label"] for x in a] == [x["label"] for x in b]
            assert all(abs(x["probabilities"][k] - y["probabilities"][k]) < 1e-4
                       for x, y in zip(a, b, strict=True) for k in x["probabilities"])
        else:
            assert a == b
    health = httpx.get(live.url + "/health", timeout=30).json()
    assert health["status"] == "ok"
    served_ = health["served"]
    assert sum(w["requests"] for w in served_.values()) >= 64
    assert served_["clf"]["batches"] < served_["clf"]["requests"]  # the encoder's: batched
    for engine in ("copy", "lm"):  # an engine step decodes several requests' rows at once
        assert served_[engine]["tokens_out"] > served_[engine]["batches"]


def test_a_client_that_goes_away_stops_its_generation(live, served):
    """A streamed generation of 2,000 tokens is abandoned after a few pieces; the engine
    ends that request (it is counted as cancelled) instead of generating the rest."""
    body = {"model": "lm", "prompt": "to be", "max_tokens": 2000, "temperature": 1.0,
            "seed": 1, "stream": True}
    with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n >= 3:
                break  # leave: the connection closes
    server = live.server.config.app.state.server
    deadline = time.time() + 60
    while server.served("lm")["cancelled"] < 1:
        assert time.time() < deadline, "the abandoned generation was never cancelled"
        time.sleep(0.1)
    engine = server.engines["lm"]
    assert engine.tokens_out < 2000 and not engine.busy
    r = httpx.post(live.url + "/v1/completions", timeout=60,
                   json={"model": "lm", "prompt": "to", "max_tokens": 2, "temperature": 0})
    assert r.status_code == 200


def test_a_non_streaming_client_that_goes_away_stops_its_generation(live):
    """The client of a long non-streamed completion closes its socket (a timeout): the engine
    ends that request within a second or so, not after its 2,000 tokens."""
    server = live.server.config.app.state.server
    before = server.served("lm")["cancelled"]
    body = {"model": "lm", "prompt": "to be", "max_tokens": 2000, "min_tokens": 2000,
            "temperature": 1.0, "seed": 1}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/v1/completions", json=body, timeout=1.0)
    deadline = time.time() + 30
    while server.served("lm")["cancelled"] <= before or server.engines["lm"].busy:
        assert time.time() < deadline, "the abandoned completion was never cancelled"
        time.sleep(0.05)
    assert server.engines["lm"].tokens_out < 2000


def test_a_request_is_checked_whole_before_any_of_it_runs(live):
    """Eight prompts, the last over the token limit: a 400, and none of the seven others was
    queued (before, they generated for minutes for nobody). So too a request of more
    completions than the server queues: a 400 naming n, not a 503 after queueing half."""
    server = live.server.config.app.state.server
    before = server.served("lm")["requests"]
    limit = server.limits.max_prompt_tokens
    prompts = ["to be"] * 7 + ["a" * (limit + 10)]
    r = httpx.post(live.url + "/v1/completions", timeout=60,
                   json={"model": "lm", "prompt": prompts, "max_tokens": 2000})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
    r = httpx.post(live.url + "/v1/completions", timeout=60,
                   json={"model": "lm", "prompt": ["Hi"] * 64, "n": 8, "max_tokens": 2})
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text
    assert "queues at most" in r.json()["error"]["message"]
    assert server.served("lm")["requests"] == before
    assert not server.engines["lm"].busy
