"""Guesses from a draft model (engine/draft.py): the draft decodes greedily after a row's
context, keeping its own cache from one guess to the next (the keys of guesses that failed
taken back); whatever it guesses, the target's tokens and log-probabilities are plain
decoding's."""

import pytest
import torch

from tests.conftest import DEVICE
from tests.engine.test_speculate import assert_decodings_equal, decode, lm, repeating  # noqa: F401
from vaswani import ModelConfig, build_model
from vaswani.engine import Params
from vaswani.engine.draft import DraftModel
from vaswani.engine.request import Sequence
from vaswani.generation import Rules


def small_model(seed: int, **kw) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = ModelConfig(**{**dict(arch="decoder", vocab_size=300, d_model=64, n_heads=2,
                                   d_ff=128, n_layers=2, dropout=0.0, max_len=96, pad_id=0),
                            **kw})
    return build_model(config).to(DEVICE).double().eval()


def greedy(model, context: list[int], n: int) -> list[int]:
    """The reference: n greedy tokens after ``context``, the whole context run each time."""
    out = list(context)
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([out], device=DEVICE), mask=True)
            out.append(int(logits[0, -1].argmax()))
    return out[len(context):]


def test_a_draft_guesses_its_greedy_continuation_and_reuses_its_cache():
    model = small_model(0)
    draft = DraftModel(model)
    g = torch.Generator().manual_seed(3)
    seq = Sequence(torch.randint(3, 300, (11,), generator=g, device="cpu").tolist())
    for step in range(6):  # the context grows by guesses that held and tokens that did not
        context = seq.tokens[seq.offset:]
        guess = draft(seq, 4)
        assert guess == greedy(model, context, 4)
        kept = guess[:step % 3] + [(guess[0] + 1) % 300]  # some held, then another token
        seq.tokens += kept
        # the draft's cache holds what it fed, at most the context (never a failed guess's)
        row = draft.rows[seq]
        assert row.cache.length == len(row.tokens) <= len(context) + 3
    assert draft(seq, 200) == greedy(model, seq.tokens, 96 - len(seq.tokens))  # max_len


def test_a_draft_that_slides_with_its_row_starts_over():
    model = small_model(0)
    draft = DraftModel(model)
    seq = Sequence(list(range(3, 40)))
    assert draft(seq, 3) == greedy(model, seq.tokens, 3)
    seq.offset = 5  # the context slid past max_len: positions count from the offset
    assert draft(seq, 3) == greedy(model, seq.tokens[5:], 3)


@pytest.mark.parametrize("same", [True, False], ids=["itself", "another"])
def test_a_rows_tokens_are_plain_decodings_whatever_the_draft_guesses(lm, same):  # noqa: F811
    """The target model as its own draft (every guess holds but ties) or another model of
    the vocabulary (few hold): greedy, seeded sampling and rules, mixed with requests that do
    not guess, as in test_speculate.py."""
    params = [Params(max_new_tokens=30, logprobs=3),
              Params(max_new_tokens=25, temperature=0.9, top_p=0.9, seed=7, logprobs=2),
              Params(max_new_tokens=20, rules=Rules(repetition_penalty=1.3), logprobs=1)]
    prompts = repeating(6)
    plain, _ = decode(lm, prompts, params)
    guessing = [Params(**{**p.__dict__, "speculate": 4}) for p in params]
    drafted = lm if same else small_model(1)
    got, engine = decode(lm, prompts, guessing, guesser=DraftModel(drafted))
    assert_decodings_equal(got, plain)
    said = engine.speculation
    assert said.passes > 0
    if same:  # greedy rows' guesses hold: its own greedy tokens
        assert said.accepted > said.guessed / 2
    mixed, _ = decode(lm, prompts, [guessing[0], params[1], guessing[2]],
                      guesser=DraftModel(drafted))
    assert_decodings_equal(mixed, plain)
