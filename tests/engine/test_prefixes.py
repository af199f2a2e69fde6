"""Prefix caching (engine/prefixes.py): a request whose prompt starts with kept blocks starts
after them and decodes as it would alone; requests that arrive together sharing a prefix
compute it once; a chat's next turn starts after the last one's prompt and answer; the kept
bytes stay within the budget, least recently used first out, a parent kept while a child
needs it; an adapter's prefix is not another's."""

import random

import torch

from tests.engine.test_engine import BOS, EOS, alone, model
from vaswani.engine import Engine, EngineConfig, Params, Request
from vaswani.engine.prefixes import BLOCK, PrefixCache


def engine(lm, **kw):
    return Engine(lm, bos_id=BOS, eos_id=EOS, config=EngineConfig(**kw))


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randint(3, 22) for _ in range(n)]


def lm():
    return model("decoder", max_len=256)


def test_requests_sharing_a_system_prompt_compute_it_once_and_decode_as_alone():
    m = lm()
    system = tokens(4 * BLOCK, 0)
    cases = [(system + tokens(3 + i % 4, 100 + i),
              Params(max_new_tokens=6) if i % 2 else
              Params(max_new_tokens=6, temperature=0.9, seed=i)) for i in range(16)]
    e = engine(m, max_rows=16)
    requests = [Request(p, params) for p, params in cases]
    e.run(requests)
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.output == alone(m, p, params)
    s = e.scheduler
    computed = len(cases[0][0]) + sum(len(p) - len(system) for p, _ in cases[1:])
    assert s.prefilled_tokens == computed  # the system prompt once, every suffix once
    assert s.prefixes.hit == 15 * len(system)
    assert s.prefixes.queried == sum(len(p) for p, _ in cases)
    off = engine(m, max_rows=16, prefix_bytes=0)
    again = [Request(p, params) for p, params in cases]
    off.run(again)
    assert [r.output for r in again] == [r.output for r in requests]
    assert off.scheduler.prefilled_tokens == sum(len(p) for p, _ in cases)
    assert off.scheduler.prefixes.hit == 0 and not off.scheduler.prefixes.segments
    assert off.scheduler.prefixes.queried == s.prefixes.queried


def test_a_chats_next_turn_starts_after_the_last_turns_prompt_and_answer():
    m = lm()
    e = engine(m, max_rows=4)
    prefixes = e.scheduler.prefixes
    history, fed = tokens(37, 1), 0
    for turn in range(4):
        params = Params(max_new_tokens=9 + turn)
        request = Request(history, params)
        before = prefixes.hit
        e.run([request])
        assert request.output == alone(m, history, params)
        # all that the last turn fed (its prompt and answer: whole blocks and the tail)
        assert prefixes.hit - before == min(fed, len(history) - 1), turn
        fed = request.sequences[0].cached
        history = history + request.output + tokens(5, 10 + turn)  # the user's next words
    assert fed > 3 * BLOCK


def test_kept_bytes_stay_in_the_budget_and_a_parent_outlives_its_children():
    m = lm()
    e = engine(m, max_rows=4)
    prefixes = e.scheduler.prefixes
    per_block = e.cache.bytes_per_token * BLOCK
    prefixes.budget = 5 * per_block
    system = tokens(2 * BLOCK, 3)

    def run(prompt):
        before = prefixes.hit
        e.run([Request(prompt, Params(max_new_tokens=1))])
        assert prefixes.bytes <= prefixes.budget
        return prefixes.hit - before

    own = [tokens(BLOCK, 50 + i) for i in range(6)]  # whole blocks: no tails
    for i in range(6):  # the first keeps three blocks; each after it, its third below them
        assert run(system + own[i]) == (2 * BLOCK if i else 0)
    [first] = [s for s in prefixes.segments if s.start == 0]
    children = [s for s in prefixes.segments if s is not first]
    assert (first.start, first.end) == (0, 3 * BLOCK) and first.children == 2
    assert [(c.parent, c.start, c.end) for c in children] == [(first, 2 * BLOCK, 3 * BLOCK)] * 2
    assert run(system + own[5] + [3]) == 3 * BLOCK  # kept whole
    assert run(system + own[1] + [3]) == 2 * BLOCK  # its own block dropped, the shared kept
    for child in [c for c in prefixes.segments if c is not first]:
        prefixes.segments.move_to_end(child)  # the parent is now the least recently used
    run(tokens(BLOCK, 99))  # a block of another prompt: a child goes, not the parent
    assert first in prefixes.segments and first.children == 1


def test_the_kept_keys_are_the_ones_a_whole_prefill_computes():
    m = lm()
    e = engine(m, max_rows=4)
    prompt = tokens(3 * BLOCK + 5, 7)
    first = Request(prompt, Params(max_new_tokens=1))
    e.run([first])
    [segment] = [s for s in e.scheduler.prefixes.segments if s.start == 0]
    whole = engine(m, max_rows=4, prefix_bytes=0)
    probe = Request(prompt, Params(max_new_tokens=1))
    whole.submit(probe)
    whole.scheduler.plan()  # admitted, not yet prefilled: then the prefill alone
    whole.runner.forward([(probe, probe.sequences[0], len(prompt))])
    k, v = whole.cache.read(probe.sequences[0].slot, 0, 3 * BLOCK)
    torch.testing.assert_close(segment.k, k, rtol=0, atol=0)
    torch.testing.assert_close(segment.v, v, rtol=0, atol=0)


def test_an_adapters_prefix_and_a_slid_context_are_not_found():
    m = lm()
    cache = engine(m).cache
    prefixes = PrefixCache(cache, 1 << 20)
    prompt = tokens(3 * BLOCK, 9)
    base, adapted = Request(prompt, Params(max_new_tokens=1)), \
        Request(prompt, Params(max_new_tokens=1), adapter=1)
    assert prefixes.names(base, len(prompt)) != prefixes.names(adapted, len(prompt))
    assert len(prefixes.names(base, len(prompt) - 1)) == 2  # whole blocks only
    slid = Request(prompt, Params(max_new_tokens=1))
    slid.sequences[0].offset = 4
    assert prefixes.usable(base) and not prefixes.usable(slid)


def test_an_offline_engine_and_a_translator_keep_nothing():
    assert EngineConfig.offline(8).prefix_bytes == 0
    mt = model("encoder-decoder")
    assert engine(mt).scheduler.prefixes.budget == 0
