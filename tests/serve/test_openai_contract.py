"""The OpenAI routes as evaluators and clients use them: log-probabilities (the model's own,
equal to what ``Run.score`` sums), echo, scoring without generating, prompts as token ids,
streamed log-probabilities and usage, and every field either implemented, accepted as a no-op
or refused by name; the real ``openai`` client gets OpenAI's shapes, streaming and not."""

import json
import math

import pytest

from vaswani.serve import schemas

TEXT = "to be or not to be"


def post(client, route, **body):
    r = client.post(route, json=body)
    return r.status_code, r.json()


def test_echo_with_no_new_token_scores_the_prompt_as_run_score_does(client, served):
    status, out = post(client, "/v1/completions", model="lm", prompt=TEXT, echo=True,
                       logprobs=2, max_tokens=0)
    assert status == 200, out
    [choice] = out["choices"]
    lp = choice["logprobs"]
    assert choice["text"] == TEXT and out["usage"]["completion_tokens"] == 0
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == TEXT and lp["text_offset"][0] == 0
    assert all(len(top) == 2 and max(top.values()) >= own for own, top in
               zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:], strict=True))
    scored = served["lm"].score(TEXT)
    assert sum(lp["token_logprobs"][1:]) == pytest.approx(-scored["loss"] * scored["tokens"],
                                                          abs=1e-4)


def test_generated_tokens_carry_their_log_probabilities_before_any_decoding_setting(client,
                                                                                     served):
    """Greedy: each chosen token is its place's most likely. With a strong repetition penalty
    the chosen tokens are not, yet their log-probabilities are still the model's own: what
    scoring the prompt and those tokens (echo) gives."""
    status, out = post(client, "/v1/completions", model="lm", prompt=TEXT, logprobs=3,
                       max_tokens=8, min_tokens=8, temperature=0)
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == 8 and lp["text_offset"][0] == len(TEXT)
    for own, top in zip(lp["token_logprobs"], lp["top_logprobs"], strict=True):
        assert len(top) == 3 and own == pytest.approx(max(top.values()), abs=1e-6)
    run = served["lm"]  # the engine's own record, beside the model's scoring of it
    ids = run.source_tokenizer.encode(TEXT)
    decode = run.decode_options(max_new_tokens=6, min_length=6, temperature=0,
                                repetition_penalty=5.0)
    completion = run.completion(TEXT, decode, logprobs=1)
    run.engine_for(1).run([completion.request])
    made, kept = completion.request.output, completion.request.logprobs
    assert len(kept) == len(made) == 6
    assert any(own < top[0][1] - 1e-6 for own, top in kept)  # the penalty moved a choice
    scored = run.token_logprobs(ids + made, top=1)[len(ids) - 1:]
    assert [own for own, _ in kept] == pytest.approx([own for own, _ in scored], abs=1e-4)


def test_a_prompt_of_token_ids_is_the_prompt_of_their_text(client, served):
    ids = served["lm"].source_tokenizer.encode(TEXT)
    body = dict(model="lm", max_tokens=5, temperature=0, logprobs=1)
    _, as_text = post(client, "/v1/completions", prompt=TEXT, **body)
    _, as_ids = post(client, "/v1/completions", prompt=ids, **body)
    _, both = post(client, "/v1/completions", prompt=[ids, ids[:2]], echo=True, **body)
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]
    assert both["choices"][0]["text"] == TEXT + as_text["choices"][0]["text"]
    assert len(both["choices"]) == 2
    status, out = post(client, "/v1/completions", model="lm", prompt=[1, 10**6])
    assert status == 400 and "holds token 1000000" in out["error"]["message"]


def test_scoring_past_the_models_context_or_zero_tokens_without_echo_is_refused(client,
                                                                              served):
    status, out = post(client, "/v1/completions", model="lm", prompt=TEXT, max_tokens=0)
    assert status == 400 and out["error"]["param"] == "max_tokens"
    limit = served["lm"].config.model.max_len
    status, out = post(client, "/v1/completions", model="lm", prompt=[5] * (limit + 1),
                       echo=True, logprobs=1, max_tokens=0)
    assert status == 400 and f"reads at most {limit}" in out["error"]["message"]


def test_chat_log_probabilities_are_openais_chat_object(client):
    messages = [{"role": "user", "content": "abc"}]
    status, out = post(client, "/v1/chat/completions", model="llama", messages=messages,
                       logprobs=True, top_logprobs=2, max_tokens=4, min_tokens=4,
                       temperature=0)
    assert status == 200, out
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == 4
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode())
        assert len(entry["top_logprobs"]) == 2
    status, out = post(client, "/v1/chat/completions", model="llama", messages=messages,
                       top_logprobs=2)
    assert status == 400 and out["error"]["param"] == "top_logprobs"


def test_a_stream_carries_each_pieces_log_probabilities_and_the_usage_last(client):
    body = dict(model="lm", prompt=TEXT, logprobs=1, max_tokens=6, min_tokens=6,
                temperature=0, stream=True, echo=True,
                stream_options={"include_usage": True})
    with client.stream("POST", "/v1/completions", json=body) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines()
                  if line.startswith("data: {")]
    *text_chunks, usage = chunks
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    assert text_chunks[0]["choices"][0]["text"] == TEXT  # the echo first
    tokens = [t for c in text_chunks[1:] for t in c["choices"][0]["logprobs"]["tokens"]]
    assert len(tokens) == 6
    whole = post(client, "/v1/completions", **{k: v for k, v in body.items()
                                                 if k not in ("stream", "stream_options")})[1]
    assert "".join(c["choices"][0]["text"] for c in text_chunks) == \
        whole["choices"][0]["text"]


@pytest.mark.parametrize("name", sorted(schemas.REFUSED))
def test_a_field_the_server_does_not_implement_is_a_400_naming_it(client, name):
    value = {"best_of": 3}.get(name, {"x": 1})
    status, out = post(client, "/v1/completions", model="lm", prompt="a", max_tokens=1,
                       **{name: value})
    assert status == 400, (name, out)
    assert out["error"]["param"] == name and name in out["error"]["message"]


def test_no_op_fields_and_harmless_defaults_are_accepted_and_unknown_ones_refused(client):
    accepted = {**{name: "x" for name in schemas.NO_OPS}, "parallel_tool_calls": True,
                "best_of": 1, "logit_bias": {}, "response_format": {"type": "text"},
                "tools": [], "tool_choice": "none"}
    status, out = post(client, "/v1/completions", model="lm", prompt="a", max_tokens=1,
                       **accepted)
    assert status == 200, out
    for route, body in (("/v1/completions", {"prompt": "a"}),
                        ("/v1/translate", {"input": "ab"}),
                        ("/v1/embeddings", {"input": "ab"})):
        model = {"/v1/completions": "lm", "/v1/translate": "copy"}.get(route, "bert")
        status, out = post(client, route, model=model, temprature=0.5, **body)
        assert status == 400 and out["error"]["param"] == "temprature", (route, out)
    status, out = post(client, "/v1/chat/completions", model="llama",
                       messages=[{"role": "user", "content": "a", "name": "x"}])
    assert status == 422 and "name" in out["error"]["message"]


def test_every_field_of_openais_request_bodies_is_implemented_a_no_op_or_refused():
    """A list of OpenAI's fields (completions and chat, 2026): none falls through."""
    openai_fields = {
        "completions": ["model", "prompt", "best_of", "echo", "frequency_penalty",
                        "logit_bias", "logprobs", "max_tokens", "n", "presence_penalty",
                        "seed", "stop", "stream", "stream_options", "suffix", "temperature",
                        "top_p", "user"],
        "chat": ["messages", "model", "audio", "frequency_penalty", "function_call",
                 "functions", "logit_bias", "logprobs", "max_completion_tokens",
                 "max_tokens", "metadata", "modalities", "n", "parallel_tool_calls",
                 "prediction", "presence_penalty", "prompt_cache_key", "reasoning_effort",
                 "response_format", "safety_identifier", "seed", "service_tier", "stop",
                 "store", "stream", "stream_options", "temperature", "tool_choice", "tools",
                 "top_logprobs", "top_p", "user", "verbosity", "web_search_options"]}
    models = {"completions": schemas.CompletionRequest, "chat": schemas.ChatRequest}
    for route, fields in openai_fields.items():
        for name in fields:
            assert (name in models[route].model_fields or name in schemas.NO_OPS
                    or name in schemas.REFUSED), (route, name)


# --- the real openai client, on a live server -------------------------------------------------

openai = pytest.importorskip("openai", reason="the openai client is a test dependency")


def test_the_openai_client_gets_openais_log_probability_shapes(live):
    c = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                      timeout=60)
    got = c.completions.create(model="lm", prompt=TEXT, logprobs=5, echo=True, max_tokens=3,
                               temperature=0)
    lp = got.choices[0].logprobs
    assert lp.token_logprobs[0] is None and len(lp.tokens) == len(lp.top_logprobs)
    assert all(len(top) == 5 for top in lp.top_logprobs[1:])
    streamed = list(c.completions.create(model="lm", prompt=TEXT, logprobs=2, max_tokens=3,
                                         temperature=0, stream=True,
                                         stream_options={"include_usage": True}))
    assert streamed[-1].usage.completion_tokens == 3
    assert sum(len(s.choices[0].logprobs.tokens) for s in streamed if s.choices) == 3
    chat = c.chat.completions.create(model="llama", messages=[{"role": "user",
                                                               "content": "abc"}],
                                     logprobs=True, top_logprobs=3, max_tokens=3,
                                     temperature=0)
    content = chat.choices[0].logprobs.content
    assert len(content) == len(chat.choices[0].message.content and content)
    assert all(len(t.top_logprobs) == 3 and not math.isnan(t.logprob) for t in content)
    pieces = list(c.chat.completions.create(
        model="llama", messages=[{"role": "user", "content": "abc"}], logprobs=True,
        top_logprobs=3, max_tokens=3, temperature=0, stream=True))
    assert sum(len(p.choices[0].logprobs.content) for p in pieces
               if p.choices and p.choices[0].logprobs) == len(content)


def test_the_http_reference_lists_every_no_op_and_refused_field():
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "reference" / "http.md").read_text()
    for name in [*schemas.NO_OPS, *schemas.REFUSED]:
        assert f"`{name}`" in page, name
