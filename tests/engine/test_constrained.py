"""Requests whose output keeps to a JSON schema (generation/grammar.py) in the engine: every
such output parses and the schema accepts it, greedy or sampled, and a batch that mixes
constrained and free requests gives each the tokens it gets alone."""

import json

import jsonschema_rs
import pytest

from tests.engine.test_draft import small_model
from tests.generation.test_grammar import tokenizers
from vaswani.engine import Engine, Params, Request
from vaswani.generation.grammar import Grammars

SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                      "b": {"enum": ["x", "yz"]}},
     "required": ["a", "b"], "additionalProperties": False},
    {"type": "array", "items": {"type": "boolean"}, "minItems": 1, "maxItems": 4},
    {"type": "object", "properties": {"s": {"type": "string", "maxLength": 6}},
     "required": ["s"], "additionalProperties": False},
]


@pytest.fixture(scope="module")
def setup():
    tok = tokenizers()["bpe"]
    model = small_model(3, vocab_size=tok.vocab_size, max_len=128)
    return tok, model, Grammars(tok)


def test_constrained_and_free_requests_share_batches_each_as_alone(setup):
    tok, model, grammars = setup
    prompts = [tok.encode(text) for text in ("to be", "or not", "the question", "to")]
    greedy, sampled = Params(max_new_tokens=60), Params(max_new_tokens=60, temperature=1.0,
                                                       seed=3)
    asked = [(prompts[0], greedy, SCHEMAS[0]), (prompts[1], sampled, None),
             (prompts[2], sampled, SCHEMAS[1]), (prompts[3], greedy, SCHEMAS[2]),
             (prompts[1], Params(max_new_tokens=60, speculate=3), SCHEMAS[0])]

    def decode(batch):
        engine = Engine(model, bos_id=tok.bos_id, eos_id=tok.eos_id)
        requests = [Request(p, params, constraint=None if schema is None
                            else grammars.constraint(schema)) for p, params, schema in batch]
        engine.run(requests)
        return [(r.output, r.reason) for r in requests]

    together = decode(asked)
    assert together == [decode([one])[0] for one in asked]
    for (output, reason), (_, _, schema) in zip(together, asked, strict=True):
        if schema is not None:  # parsed and accepted, ending where the JSON ends
            assert reason == "stop", tok.decode(output)
            jsonschema_rs.validate(schema, json.loads(tok.decode(output)))
    free = together[1][0]
    assert free and tok.decode(free) != tok.decode(together[0][0])


def test_a_beam_search_cannot_be_constrained(setup):
    tok, _, grammars = setup
    with pytest.raises(ValueError, match="beam search"):
        Request([5], Params(max_new_tokens=3, beam=2), constraint=grammars.constraint(None))
