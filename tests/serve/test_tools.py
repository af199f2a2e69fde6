"""Tool calling through the ``openai`` client (serve/tools.py; generation/grammar.py
``Grammars.tool_calls``): a random-weight Qwen2 folder saved by ``transformers`` whose chat
template takes tools (Hermes' ``<tool_call>`` format, as Qwen2.5's) is asked to call them,
its calls come back as OpenAI's ``tool_calls`` with arguments its schema accepts, streamed
or not, and the tool's answer goes back in the conversation. A model whose template takes
no tools is refused by name."""

import json

import jsonschema_rs
import pytest

import vaswani
from tests.serve.conftest import LiveServer

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai")

TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call these functions:\n<tools>\n"
    "{%- for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    "Call one as <tool_call>\n{\"name\": ..., \"arguments\": ...}\n</tool_call><|im_end|>\n"
    "{% endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n"
    "</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>\n"
    "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n"
    "</tool_call>{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}"
    "{%- endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 8},
        "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {
        "zone": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone"], "additionalProperties": False}}}
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, CLOCK)}


def qwen2_folder(folder):
    """A Qwen2 of random weights, its byte-level tokenizer with <tool_call> and </tool_call>
    as tokens of their own (as Qwen2.5's), and a template that takes tools."""
    from tokenizers import AddedToken

    from tests.pretrained.test_hf_import import byte_level_tokenizer, configs

    tok = byte_level_tokenizer()
    tok.add_tokens([AddedToken("<tool_call>", special=False),
                    AddedToken("</tool_call>", special=False)])
    config = configs(tok.get_vocab_size())["qwen2"]
    config.max_position_embeddings = 2048  # the tools' JSON is long in a vocabulary of 300
    transformers.Qwen2ForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": "<|endoftext|>", "chat_template": TOOLS_TEMPLATE}))
    return folder


@pytest.fixture(scope="module")
def live(tmp_path_factory, small_runs):
    import shutil

    from tests.reliability.checkpoints import CHATML
    from vaswani import rundir
    from vaswani.pretrained.importer import import_checkpoint
    from vaswani.serve import create_app

    root = tmp_path_factory.mktemp("tools")
    qwen = import_checkpoint("hf", str(qwen2_folder(root / "hf")), root / "qwen", root / "c")
    plain = root / "plain"  # a chat model whose template takes no tools
    shutil.copytree(small_runs["decoder"][0], plain)
    (plain / rundir.CHAT_TEMPLATE).write_text(CHATML)
    runs = {"qwen": vaswani.load(qwen), "plain": vaswani.load(plain)}
    with LiveServer(create_app(runs)) as server:
        yield server


def client_of(live):
    return openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0,
                         timeout=120)


def check_calls(calls, names):
    assert calls and [c.function.name for c in calls][:len(names)] == names
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        jsonschema_rs.validate(SCHEMAS[call.function.name], json.loads(call.function.arguments))


def test_a_tool_call_round_trip_through_the_openai_client(live):
    client = client_of(live)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    asked = client.chat.completions.create(
        model="qwen", messages=messages, tools=[WEATHER, CLOCK], tool_choice="required",
        max_tokens=120, temperature=0)
    choice = asked.choices[0]
    assert choice.finish_reason == "tool_calls"
    check_calls(choice.message.tool_calls, [])
    named = client.chat.completions.create(
        model="qwen", messages=messages, tools=[WEATHER, CLOCK], max_tokens=120, seed=3,
        temperature=1.0, tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(named.choices[0].message.tool_calls, ["get_time"])
    assert len(named.choices[0].message.tool_calls) == 1
    single = client.chat.completions.create(
        model="qwen", messages=messages, tools=[WEATHER, CLOCK], tool_choice="required",
        parallel_tool_calls=False, max_tokens=120, temperature=1.0, seed=5)
    check_calls(single.choices[0].message.tool_calls, [])
    assert len(single.choices[0].message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    answered = client.chat.completions.create(  # the tool's answer, back in the conversation
        model="qwen", max_tokens=8, temperature=0, tools=[WEATHER, CLOCK], tool_choice="none",
        messages=[*messages, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": call.function.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": "22 degrees"}])
    assert answered.choices[0].finish_reason in ("stop", "length")
    assert answered.choices[0].message.tool_calls is None
    auto = client.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER],
                                          max_tokens=40, temperature=1.0, seed=1)
    made = auto.choices[0].message  # text, calls, or both: any call keeps to its schema
    if made.tool_calls:
        check_calls(made.tool_calls, [])


def test_tool_calls_stream_as_openais_deltas(live):
    client = client_of(live)
    messages = [{"role": "user", "content": "Time in Tokyo?"}]
    whole = client.chat.completions.create(model="qwen", messages=messages, tools=[CLOCK],
                                           tool_choice="required", max_tokens=60,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model="qwen", messages=messages, tools=[CLOCK], tool_choice="required", max_tokens=60,
        temperature=0, stream=True, stream_options={"include_usage": True}))
    calls = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    expected = whole.choices[0].message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == \
        [(c.function.name, c.function.arguments) for c in expected]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_tools_a_model_cannot_take_are_refused_by_name(live):
    client = client_of(live)
    messages = [{"role": "user", "content": "to be"}]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="plain", messages=messages, tools=[WEATHER])
    assert e.value.body["param"] == "tools" and "takes no tools" in e.value.body["message"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER],
                                       tool_choice={"type": "function",
                                                    "function": {"name": "get_time"}})
    assert e.value.body["param"] == "tool_choice"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="qwen", messages=messages, tools=[WEATHER],
                                       response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"
    # tool_choice "none": text only, and a template that takes no tools may be asked so
    plain = client.chat.completions.create(model="plain", messages=messages, max_tokens=4,
                                           tools=[WEATHER], tool_choice="none")
    assert plain.choices[0].message.tool_calls is None
