"""Output held to a JSON schema (generation/grammar.py): the tokens of a text the schema
accepts are allowed one after another, and then only <eos>; a token that would break it is
not; a schema that cannot be compiled is an error that says why; a schema is compiled once."""

import pytest

from vaswani.data.tokenizers import BPETokenizer, CharTokenizer
from vaswani.generation.grammar import GrammarError, Grammars, grammars

JSON_TEXT = '{"name": "ada", "tags": ["x", "y"], "n": 12, "ok": true}'
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}},
    "n": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "tags", "n", "ok"], "additionalProperties": False}


def tokenizers():
    chars = CharTokenizer.train([JSON_TEXT + "abcdefghijklmnopqrstuvwxyz0123456789-.\\"])
    bpe = BPETokenizer.train([JSON_TEXT * 20, "to be or not to be"], 300)
    return {"char": chars, "bpe": bpe}


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_text_the_schema_accepts_is_allowed_token_by_token_then_only_eos(kind):
    tok = tokenizers()[kind]
    constraint = Grammars(tok).constraint(SCHEMA)
    for token in tok.encode(JSON_TEXT):
        assert not constraint.finished
        assert constraint.allowed(tok.vocab_size)[token], tok.token(token)
        constraint.consume(token)
    assert constraint.finished
    assert constraint.allowed(tok.vocab_size + 5).nonzero().flatten().tolist() == [tok.eos_id]


@pytest.mark.parametrize("kind", ["char", "bpe"])
def test_a_token_that_breaks_the_schema_is_not_allowed(kind):
    tok = tokenizers()[kind]
    constraint = Grammars(tok).constraint(SCHEMA)
    allowed = constraint.allowed(tok.vocab_size)
    assert allowed[tok.encode(JSON_TEXT)[0]] and not allowed[tok.encode("a")[0]]
    assert not allowed[tok.eos_id]  # nothing is complete yet
    if kind == "char":  # one token a character: the grammar's next character is explicit
        for token in tok.encode('{"name": '):
            constraint.consume(token)
        allowed = constraint.allowed(tok.vocab_size)
        assert allowed[tok.encode('"')[0]] and not allowed[tok.encode("1")[0]]  # a string
    with pytest.raises(RuntimeError, match="breaks the grammar"):
        constraint.consume(tok.encode("1")[0])


def test_any_object_and_key_order_as_written():
    tok = tokenizers()["char"]
    constraint = Grammars(tok).constraint(None)  # response_format json_object
    for token in tok.encode('{"z": [1, {"a": null}]}'):
        constraint.consume(token)
    assert constraint.finished
    ordered = Grammars(tok).constraint({"type": "object", "properties": {
        "z": {"type": "integer"}, "a": {"type": "integer"}}, "required": ["z", "a"]})
    for token in tok.encode('{"z": 1, '):
        ordered.consume(token)
    assert ordered.allowed(tok.vocab_size)[tok.encode('"')[0]]
    with pytest.raises(RuntimeError):  # "a" comes second, as the schema lists it
        ordered.consume(tok.encode("}")[0])


@pytest.mark.parametrize("schema, why", [({"type": "nonsense"}, "Invalid type"),
                                         ({"$ref": "#/nope"}, "does not exist"),
                                         ({"type": "string", "pattern": "("}, "regex")])
def test_a_schema_that_cannot_be_compiled_says_why(schema, why):
    with pytest.raises(GrammarError, match=why):
        Grammars(tokenizers()["char"]).constraint(schema)


def test_a_tokenizer_is_read_once_and_a_schema_compiled_once():
    tok = tokenizers()["bpe"]
    assert grammars(tok) is grammars(tok)
    g = grammars(tok)
    first, second = g.constraint(SCHEMA), g.constraint(SCHEMA)
    assert g.compiled.cache_info().hits >= 1 and g.compiled.cache_info().misses == 1
    start = tok.encode(JSON_TEXT)[0]
    first.consume(start)  # each request's copy follows its own tokens
    assert second.allowed(tok.vocab_size)[start] and not first.allowed(tok.vocab_size)[start]


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_parallel_tool_calls_false_allows_one_call_only(choice):
    body = '\n{"name": "f", "arguments": {"n": 1}}\n'
    tok = BPETokenizer.train([body * 20, "to be or not to be"], 300)
    tok.hf.add_special_tokens(["<tool_call>", "</tool_call>"])  # markers as Qwen2's are
    opening, closing = tok.hf.token_to_id("<tool_call>"), tok.hf.token_to_id("</tool_call>")
    tools = [{"name": "f", "parameters": {"type": "object", "properties": {
        "n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False}}]
    newline = tok.encode("\n")[0]

    def after_one_call(parallel):
        constraint = Grammars(tok).tool_calls(tools, choice, parallel)
        for token in [opening, *tok.encode(body), closing]:
            constraint.consume(token)
        return constraint

    vocab = tok.hf.get_vocab_size()
    one, more = after_one_call(False), after_one_call(True)
    assert one.allowed(vocab)[tok.eos_id] and more.allowed(vocab)[tok.eos_id]
    if choice == "auto":  # text may follow; a second call only where calls are parallel
        one.consume(newline), more.consume(newline)
    else:
        assert one.allowed(vocab).nonzero().flatten().tolist() == [tok.eos_id]
        more.consume(newline)
    assert more.allowed(vocab)[opening] and not one.allowed(vocab)[opening]
