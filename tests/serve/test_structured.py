"""Structured output through the server (response_format; generation/grammar.py), asked
with the ``openai`` client as its users ask: every output parses as JSON and its schema
accepts it, on /v1/completions and /v1/chat/completions, streamed or not; a schema that
cannot be compiled is a 400 naming response_format."""

import json
import shutil

import jsonschema_rs
import pytest

import vaswani
from tests import conftest
from tests.serve.conftest import LiveServer

openai = pytest.importorskip("openai")

WORD = {"type": "string", "maxLength": 6}
SMALL = {"type": "integer", "minimum": -5, "maximum": 500}
# Every string, number and array is bounded: a model of random weights may not close one by
# itself, and each output must end within max_tokens wherever it is sampled.
SCHEMAS = [  # nested objects, enums, arrays, required fields, and the JSON kinds
    {"type": "object", "properties": {"a": SMALL, "b": {"enum": ["x", "yz"]}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "object", "properties": {"outer": {"type": "object", "properties": {
        "inner": WORD, "n": SMALL}, "required": ["inner", "n"], "additionalProperties": False}},
     "required": ["outer"], "additionalProperties": False},
    {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "minItems": 1,
     "maxItems": 3},
    {"type": "boolean"},
    {"enum": ["yes", "no", "maybe"]},
    {"type": "object", "properties": {"name": WORD, "age": SMALL, "ok": {"type": "boolean"}},
     "required": ["name"], "additionalProperties": False},
    {"type": "array", "items": {"type": "object", "properties": {"id": SMALL},
                                "required": ["id"], "additionalProperties": False},
     "maxItems": 2},
    {"type": "object", "properties": {"kind": {"const": "point"}, "x": SMALL, "y": SMALL},
     "required": ["kind", "x", "y"], "additionalProperties": False},
    {"type": "integer", "minimum": 10, "maximum": 99},
    {"anyOf": [WORD, SMALL]},
    {"type": "array", "items": {"type": "array", "items": SMALL, "maxItems": 2},
     "minItems": 1, "maxItems": 2},
    {"type": "object", "properties": {"a": SMALL, "b": SMALL, "c": SMALL},
     "required": ["a", "c"], "additionalProperties": False},
    {"type": "null"},
    {"type": "number", "minimum": 0, "maximum": 1, "multipleOf": 0.25},
    {"type": "string", "pattern": "^[a-c]{2,4}$"},
    {"type": "object", "properties": {"l1": {"type": "object", "properties": {
        "l2": {"type": "object", "properties": {"l3": {"enum": [1, 2, 3]}},
               "required": ["l3"], "additionalProperties": False}},
        "required": ["l2"], "additionalProperties": False}},
     "required": ["l1"], "additionalProperties": False},
    {"type": "array", "items": SMALL, "minItems": 2, "maxItems": 3},
    {"type": "object", "properties": {"with space": WORD, "quote\"d": SMALL},
     "required": ["with space", "quote\"d"], "additionalProperties": False},
    {"anyOf": [{"type": "object", "properties": {"cat": WORD}, "required": ["cat"],
                "additionalProperties": False},
               {"type": "object", "properties": {"dog": SMALL}, "required": ["dog"],
                "additionalProperties": False}]},
    {"type": "object", "properties": {"tags": {"type": "array", "items": WORD,
                                               "maxItems": 3},
                                      "level": {"enum": ["low", "high"]}},
     "required": ["tags", "level"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def live(small_runs, tmp_path_factory):
    """The small language model (byte-level BPE: any JSON can be written), and a copy of it
    given a chat template, served on 127.0.0.1."""
    from tests.reliability.checkpoints import CHATML
    from vaswani import rundir
    from vaswani.serve import create_app

    lm = small_runs["decoder"][0]
    chat = tmp_path_factory.mktemp("chat") / "chat"
    shutil.copytree(lm, chat)
    (chat / rundir.CHAT_TEMPLATE).write_text(CHATML)
    runs = {name: vaswani.load(d, device=str(conftest.DEVICE))
            for name, d in (("lm", lm), ("chat", chat))}
    with LiveServer(create_app(runs)) as server:
        yield server


def format_of(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema,
                                                   "strict": True}}


def test_twenty_schemas_every_output_parses_and_validates(live):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    for i, schema in enumerate(SCHEMAS):
        for temperature in (0.0, 1.0):
            answer = client.completions.create(
                model="lm", prompt="to be", max_tokens=200, temperature=temperature, seed=i,
                extra_body={"response_format": format_of(schema)})
            choice = answer.choices[0]
            assert choice.finish_reason == "stop", (schema, choice.text)
            jsonschema_rs.validate(schema, json.loads(choice.text))


def test_chat_json_object_and_schema_streamed_or_not(live):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                           timeout=120)
    messages = [{"role": "user", "content": "the question"}]
    answer = client.chat.completions.create(model="chat", messages=messages, max_tokens=20,
                                            response_format={"type": "json_object"})
    assert answer.choices[0].message.content.startswith("{")  # (any object: it may not end)
    schema = SCHEMAS[0]
    whole = client.chat.completions.create(model="chat", messages=messages, max_tokens=200,
                                           response_format=format_of(schema), temperature=0)
    jsonschema_rs.validate(schema, json.loads(whole.choices[0].message.content))
    pieces = client.chat.completions.create(model="chat", messages=messages, max_tokens=200,
                                            response_format=format_of(schema), temperature=0,
                                            stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
    assert text == whole.choices[0].message.content
    free = client.chat.completions.create(model="chat", messages=messages, max_tokens=20,
                                          temperature=0, response_format={"type": "text"})
    assert free.choices[0].message.content != text


def test_a_schema_that_cannot_be_compiled_is_a_400_naming_response_format(live):
    client = openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="lm", prompt="a", max_tokens=5, extra_body={
            "response_format": format_of({"type": "string", "pattern": "("})})
    assert e.value.body["param"] == "response_format"
    assert "cannot be compiled" in e.value.body["message"]
    with pytest.raises(openai.UnprocessableEntityError):  # a json_schema with no schema name
        client.completions.create(model="lm", prompt="a", max_tokens=5, extra_body={
            "response_format": {"type": "json_schema"}})
