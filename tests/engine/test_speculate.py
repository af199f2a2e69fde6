"""Speculative decoding (engine/speculate.py): a request that guesses tokens from its context
gets the tokens, log-probabilities and seeded samples it gets without guessing, in fewer
forward passes where its text repeats itself; guesses never pass its limit, its slot or the
model's max_len."""

import pytest
import torch

from tests.conftest import DEVICE
from tests.engine.test_runner import int8_model
from vaswani import ModelConfig, build_model
from vaswani.engine import Engine, EngineConfig, Params, Request
from vaswani.engine.speculate import prompt_lookup
from vaswani.generation import Rules

BOS, EOS = 1, 2


def test_prompt_lookup_continues_the_latest_earlier_occurrence_of_the_longest_suffix():
    context = [5, 6, 7, 8, 9, 6, 7, 3, 4, 5, 6, 7]
    assert prompt_lookup(context, 3) == [8, 9, 6]  # the longest suffix, "5 6 7", at 0..2
    assert prompt_lookup(context, 2, ngram=2) == [3, 4]  # "6 7": the latest, 5..6, not 1..2
    assert prompt_lookup(context, 5, ngram=1, shortest=1) == [3, 4, 5, 6, 7]  # "7" at 6
    assert prompt_lookup([1, 2, 3], 4) == []  # nothing occurs before
    # one token seen before is no match (two at least), unless asked
    assert prompt_lookup([1, 2, 3, 1], 2) == []
    assert prompt_lookup([1, 2, 3, 1], 2, shortest=1) == [2, 3]
    # an occurrence near the end: the guess goes on as the stretch repeats
    assert prompt_lookup([4, 4, 4], 4) == [4, 4, 4, 4]
    assert prompt_lookup([1, 2, 3, 1, 2, 3, 1, 2], 5) == [3, 1, 2, 3, 1]
    assert prompt_lookup([9], 4) == [] and prompt_lookup([1, 2, 1, 2], 0) == []


# heads of 64 numbers; SmolLM2's kind too: grouped-query attention, rotary positions, RMSNorm
KINDS = {"paper": {}, "llama": dict(d_model=384, n_heads=6, n_kv_heads=2, positional="rope",
                                    norm="rmsnorm", activation="swiglu", bias=False)}


@pytest.fixture(scope="module", params=list(KINDS))
def lm(request):
    if DEVICE.type != "cpu":  # int8 weights run on a CPU; a float model elsewhere
        torch.manual_seed(0)
        return build_model(ModelConfig(**{**dict(arch="decoder", vocab_size=300, d_model=128,
                                                 n_heads=2, d_ff=256, n_layers=2, dropout=0.0,
                                                 max_len=96, pad_id=0),
                                          **KINDS[request.param]})).to(DEVICE).eval()
    return int8_model(**KINDS[request.param])


def repeating(n):
    """Prompts that repeat a stretch of themselves: something for the lookup to find."""
    g = torch.Generator().manual_seed(2)
    out = []
    for i in range(n):
        part = torch.randint(3, 300, (4 + i % 5,), generator=g, device="cpu").tolist()
        out.append(part * (2 + i % 3) + part[:2])
    return out


def decode(model, prompts, params, guesser=None, **config):
    engine = Engine(model, bos_id=BOS, eos_id=EOS, config=EngineConfig(**config))
    engine.guesser = guesser or engine.guesser  # a draft model's (test_draft.py)
    requests = [Request(p, params[i % len(params)]) for i, p in enumerate(prompts)]
    engine.run(requests)
    return [(r.output, r.logprobs, r.reason) for r in requests], engine


def assert_decodings_equal(got, plain):
    """``decode``'s results equal: exactly on a CPU. On a GPU the pass that checks k guesses
    multiplies k + 1 positions where plain decoding multiplies one, and its products round
    differently with the number of rows (the H200 of 2026-12-04: the same tokens, log-
    probabilities a few 1e-6 apart), so there: the same tokens, top tokens and reasons, the
    log-probabilities within float32 rounding."""
    if DEVICE.type == "cpu":
        assert got == plain
        return

    def split(results):
        tokens = [(out, reason, [[t for t, _ in top] for _, top in lps or []])
                  for out, lps, reason in results]
        values = [v for _, lps, _ in results for lp, top in lps or []
                  for v in (lp, *(x for _, x in top))]
        return tokens, values

    (got_tokens, got_values), (tokens, values) = split(got), split(plain)
    assert got_tokens == tokens
    assert got_values == pytest.approx(values, abs=1e-4)


def test_guessing_gives_every_request_the_tokens_and_log_probabilities_it_gets_without(lm):
    """Greedy, seeded sampling and decoding rules, alone and batched with requests that do
    not guess; limits from 1 token up, and contexts that slide past max_len (96)."""
    params = [Params(max_new_tokens=30, logprobs=3),
              Params(max_new_tokens=25, temperature=0.9, top_p=0.9, seed=7, logprobs=2),
              Params(max_new_tokens=1),
              Params(max_new_tokens=20, rules=Rules(repetition_penalty=1.3), logprobs=1),
              Params(max_new_tokens=60, temperature=0.7, seed=3)]
    prompts = repeating(10)
    plain, _ = decode(lm, prompts, params)
    fast = [Params(**{**p.__dict__, "speculate": 4}) for p in params]
    guessed, engine = decode(lm, prompts, fast)
    assert_decodings_equal(guessed, plain)
    said = engine.speculation
    assert said.passes and 0 < said.accepted <= said.guessed  # guesses were made, some held
    # guessing and plain requests side by side, each as alone
    mixed, _ = decode(lm, prompts, [fast[0], params[1], fast[2], params[3], fast[4]])
    assert_decodings_equal(mixed, plain)
    alone, _ = decode(lm, prompts[:1], fast[:1])
    assert_decodings_equal(alone, plain[:1])


def test_a_guess_that_holds_saves_forward_passes(lm):
    """A prompt the model continues by repeating it: most guesses hold, and the request
    takes far fewer passes than tokens."""
    prompt = repeating(1)[0]
    engine = Engine(lm, bos_id=BOS, eos_id=EOS, config=EngineConfig())
    engine.pass_costs = None  # the window alone decides, whatever this machine's timings
    request = Request(prompt, Params(max_new_tokens=40, speculate=6))
    engine.run([request])
    plain = Request(prompt, Params(max_new_tokens=40))
    Engine(lm, bos_id=BOS, eos_id=EOS, config=EngineConfig()).run([plain])
    assert request.output == plain.output and len(plain.output) == 40
    s = request.speculation
    assert s.rate > 0.5 and s.guessed <= 6 * s.passes
    # a pass makes the tokens that held and one more: the steps are the prefill and the
    # passes, each making 1 + the guesses that held, plus the plain steps between them
    plain_steps = 40 - 1 - s.passes - s.accepted  # (the prefill makes the first token)
    assert engine.steps == 1 + s.passes + plain_steps < 20


def test_guesses_stay_within_the_slot_the_limit_and_max_len(lm, monkeypatch):
    from vaswani.engine import speculate

    seen = []
    verify = speculate.verify
    monkeypatch.setattr(speculate, "verify", lambda runner, sampler, rows, *a: seen.extend(
        (s.cached, s.context, r.limit - r.generated, len(g)) for r, s, g in rows)
        or verify(runner, sampler, rows, *a))
    prompt = repeating(3)[2] * 8  # 90 tokens: the context reaches max_len (96) and slides
    plain, _ = decode(lm, [prompt[:90]], [Params(max_new_tokens=40)])
    got, engine = decode(lm, [prompt[:90]], [Params(max_new_tokens=40, speculate=16)])
    assert got == plain and seen
    for cached, context, left, k in seen:
        assert k <= left - 1 and context + k <= 96 and cached + 1 + k <= engine.cache.width - 1


@pytest.mark.parametrize("rows", [1, 3])
@pytest.mark.parametrize("heads", [(9, 3), (2, 2)])
def test_each_guessed_place_attends_with_a_decoding_steps_bits(heads, rows):
    """views.py one_query_a_row: the T queries of a pass that checks guesses, each attended
    as a decoding step attends its one query (its keys a view of a wider slot), bit for bit.
    (Attended side by side, as T rows of one call, they differ in the last bits; int8 layers
    round most of that away, and a deep model's logits keep some.)"""
    from vaswani.cpu.attention import decoding_attention
    from vaswani.engine.views import one_query_a_row

    torch.manual_seed(0)
    H, Hkv = heads
    R, T, Dh, W = rows, 5, 64, 32
    q = torch.randn(R, T, H, Dh).transpose(1, 2)  # as the projections lay queries out
    slot_k, slot_v = torch.randn(2, R, Hkv, 64, Dh)  # slots wider than the keys read
    positions = torch.tensor([[20], [9], [15]][:R]) + torch.arange(T)
    mask = torch.arange(W)[None, None, None, :] <= positions[:, None, :, None]
    got = one_query_a_row(q, slot_k[:, :, :W].contiguous(), slot_v[:, :, :W].contiguous(),
                          mask, decoding_attention)
    for t in range(T):  # a decoding step's query: (R, 1, H, Dh) of its own, transposed
        one = q[:, :, t:t + 1].transpose(1, 2).contiguous().transpose(1, 2)
        want = decoding_attention(one, slot_k[:, :, :W], slot_v[:, :, :W], mask[:, :, t:t + 1])
        assert torch.equal(got[:, :, t:t + 1], want)


def test_the_guess_grows_while_guesses_hold_and_shrinks_when_they_fail():
    from vaswani.engine.request import Acceptance

    a = Acceptance()
    assert a.window == 0  # as many as asked, at first
    a.add(4, 4)
    assert a.window == 6
    a.add(6, 2)
    assert a.window == 5
    a.add(1, 0)
    assert a.window == 1 and (a.guessed, a.accepted, a.passes) == (11, 6, 3)
    assert a.as_dict()["acceptance"] == round(6 / 11, 4)


def test_a_pass_guesses_as_many_as_pay_best_by_its_timed_costs():
    """With the passes' costs timed, a row guesses the number (within its window) whose pass
    makes the most tokens a second, by its acceptance so far; before a plain step and a pass
    of that size are timed, the window alone."""
    from vaswani.engine.request import Acceptance
    from vaswani.engine.speculate import PassCosts

    a = Acceptance()
    a.add(4, 4)  # first guesses held 1 in 1, guesses after a held one 3 in 3 (priors: +1, +2)
    assert a.expected(0) == 1 and a.expected(2) == pytest.approx(1 + 2 / 3 * (1 + 0.8))
    costs = PassCosts()
    assert costs.guesses(8, a) == 8  # nothing timed yet
    for places, seconds in {1: 1.0, 2: 1.28, 3: 1.67, 4: 2.11, 5: 3.40, 9: 5.25}.items():
        costs.add(places, seconds)  # a 4-bit pass's steps on the AVX-512 Xeon
    costs.add(2, 9.0)
    costs.add(2, 1.28)  # the median of the last few: one slow pass does not decide
    assert costs.cost(2) == 1.28
    assert costs.guesses(8, a) == 2  # 2.2 tokens for 1.67 steps pays best
    assert costs.guesses(5, a) == 5  # a pass of 6 places not yet timed: the window's
    sure, fails = Acceptance(), Acceptance()
    for _ in range(20):
        sure.add(8, 8)
        fails.add(2, 0)
    assert costs.guesses(8, sure) == 3  # 5 places cost as much as 8: past 4, a guess loses
    assert costs.guesses(8, fails) == 1  # at least one guess, to see whether they hold again


def test_a_guessers_own_cost_counts_against_its_guesses():
    """A draft model's guesses cost a step of its own each: with passes that make more
    guesses pay, a guesser whose every guess costs as much as a plain step makes one guess
    pay best; a guesser as cheap as prompt lookup leaves the choice to the passes."""
    from vaswani.engine.request import Acceptance
    from vaswani.engine.speculate import PassCosts, timed_guess

    sure = Acceptance()
    for _ in range(20):
        sure.add(4, 4)
    costs = PassCosts()
    for places in range(1, 6):
        costs.add(places, 1.0 + 0.1 * (places - 1))  # cheap places: 4 guesses pay best
    assert costs.guesses(4, sure) == 4
    costs.add_guesses(0, 5.0)  # no guess made: nothing learnt of the guesser
    assert costs.guesses(4, sure) == 4
    costs.add_guesses(4, 4.0)  # a guessed token costs a plain step
    assert costs.guesses(4, sure) == 1
    assert timed_guess(costs, lambda seq, n: [7] * n, None, 3) == [7, 7, 7]
    assert len(costs.guessing) == 2 and costs.guessing[-1] < 1.0  # what split() times


def test_an_engine_whose_passes_cost_more_than_guesses_make_guesses_one(lm):
    """The engine's own costs decide: with places past the second priced far above what they
    make, every pass checks one guess, and the tokens are still plain decoding's."""
    from vaswani.engine.speculate import PassCosts

    class Priced(PassCosts):
        def add(self, places, seconds):  # a fixed table, not this machine's timings
            pass

    prompt = repeating(1)[0]
    plain, _ = decode(lm, [prompt], [Params(max_new_tokens=40)])
    engine = Engine(lm, bos_id=BOS, eos_id=EOS, config=EngineConfig())
    engine.pass_costs = Priced()
    for places in range(1, 8):
        PassCosts.add(engine.pass_costs, places, {1: 1.0, 2: 1.01}.get(places, 100.0))
    request = Request(prompt, Params(max_new_tokens=40, speculate=6))
    engine.run([request])
    assert (request.output, request.logprobs, request.reason) == plain[0]
    s = request.speculation
    assert s.passes > 5 and s.guessed == s.passes  # one guess a pass
