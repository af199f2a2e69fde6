"""The inference engine decodes each request as the reference decoders of generation/ decode
it alone (greedy and seeded sampling: token for token; beam search: the same hypotheses),
whatever else it runs, through chunked prefill, sliding windows, preemption, cancellation and
failures; and every request finishes exactly once."""

import random

import pytest
import torch

from tests.conftest import DEVICE
from vaswani import ModelConfig, build_model
from vaswani.config.sections import MAX_SEED
from vaswani.engine import Engine, EngineConfig, Params, Request, Status
from vaswani.engine.runner import consecutive
from vaswani.generation import Rules, beam_decode, generate, greedy_decode
from vaswani.nn import kv_cache
from vaswani.nn.kv_cache import KV

PAD, BOS, EOS = 0, 1, 2
SMALL = dict(vocab_size=23, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout=0.0,
             max_len=40, pad_id=PAD)
RULES = [Rules(), Rules(repetition_penalty=1.3), Rules(presence_penalty=0.5,
         frequency_penalty=0.3), Rules(no_repeat_ngram_size=2), Rules(min_length=6),
         Rules(no_repeat_ngram_size=3, repetition_penalty=1.2, min_length=3)]


def model(arch, **kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(arch=arch, **{**SMALL, **kw})).to(DEVICE).eval()


def prompts(n, seed=0, low=1, high=15):
    rng = random.Random(seed)
    return [[rng.randint(3, 22) for _ in range(rng.randint(low, high))] for _ in range(n)]


def lm_request(p, params):
    return Request(p, params)


def alone(lm, p, params):
    return generate(lm, p, max_new_tokens=params.max_new_tokens, bos_id=BOS, eos_id=EOS,
                    temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                    seed=params.seed, rules=params.rules)


def engine(m, **kw):
    return Engine(m, bos_id=BOS, eos_id=EOS, config=EngineConfig(**kw))


def test_every_decoding_rule_together_equals_each_request_alone():
    lm = model("decoder")
    cases = []
    for i, p in enumerate(prompts(24)):
        rules = RULES[i % len(RULES)]
        if i % 3 == 0:
            params = Params(max_new_tokens=5 + i, rules=rules)  # greedy
        else:
            params = Params(max_new_tokens=5 + i, temperature=0.8 + i % 3 / 10, seed=i,
                            top_k=[0, 5, 1][i % 3], top_p=[1.0, 0.9, 0.7][i % 3 - 1],
                            rules=rules)
        cases.append((p, params))
    requests = [lm_request(p, params) for p, params in cases]
    engine(lm, max_rows=8, max_step_tokens=16).run(requests)
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.output == alone(lm, p, params), (p, params)
        assert request.reason in ("stop", "length")


def test_sources_are_encoded_into_their_slots_taken_in_order_or_not():
    """A group of sources is written into its source slots a slice for each run of slots
    that follow one another (runner.py ``consecutive``), in the order of their slots,
    whatever order the group comes in: each source's cross-attention keys and values land
    in its own slot."""
    mt = model("encoder-decoder")
    e = engine(mt, max_rows=8)
    e.cache.resize(e.cache.width, e.cache.cross_width, rows=8)  # slots as if 8 were taken
    sources = [s + [EOS] for s in prompts(4, seed=2, low=2)]
    requests = [Request(s, Params(max_new_tokens=0), start=[BOS], limit=5) for s in sources]
    for slots in ([2, 3, 4, 5], [3, 0, 6, 1], [5, 4, 3, 2], [6, 7, 0, 1]):
        for r, slot in zip(requests, slots, strict=True):
            r.source_slot = slot
        e.runner.encode(requests)
        for r in requests:
            with torch.inference_mode():
                alone = mt.cross_keys_values(mt.encode(torch.tensor([r.prompt], device=DEVICE)))
            S = len(r.prompt)
            for i, (k, v) in enumerate(alone):
                torch.testing.assert_close(e.cache.ck[i][r.source_slot, :, :S], k[0])
                torch.testing.assert_close(e.cache.cv[i][r.source_slot, :, :S], v[0])


def test_slots_are_cut_into_runs_that_follow_one_another():
    assert consecutive([3, 4, 5, 0, 1, 7]) == [(0, 3, 3), (3, 0, 2), (5, 7, 1)]
    assert consecutive([2]) == [(0, 2, 1)] and consecutive([]) == []
    assert consecutive([5, 4]) == [(0, 5, 1), (1, 4, 1)]


# 640: beam.py ranks through top_k's columns, greedy rows choose through first_max's blocks
@pytest.mark.parametrize("vocab", [23, 640])
def test_translations_greedy_and_beam_equal_the_reference(vocab):
    mt = model("encoder-decoder", vocab_size=vocab)
    sources = [s + [EOS] for s in prompts(12, seed=1, low=2)]
    greedy = [Request(s, Params(max_new_tokens=0, rules=RULES[i % len(RULES)]), start=[BOS],
                      history_start=1, limit=int(1.5 * len(s) + 5))
              for i, s in enumerate(sources)]
    widths = [2 + 2 * (i % 2) for i in range(len(sources))]  # searches of 2 and 4 together
    beams = [Request(s, Params(max_new_tokens=0, beam=k, n_best=min(3, k), length_penalty=0.6,
                               rules=RULES[i % 3]), start=[BOS], history_start=1,
                     limit=int(1.5 * len(s) + 5))
             for i, (s, k) in enumerate(zip(sources, widths, strict=True))]
    engine(mt, max_rows=12).run(greedy + beams)
    for i, (s, g, b) in enumerate(zip(sources, greedy, beams, strict=True)):
        src = torch.tensor([s], device=DEVICE)
        want = greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=1.5, max_len_b=5,
                             rules=RULES[i % len(RULES)])[0]
        assert g.output == want
        want = beam_decode(mt, src, beam=widths[i], n_best=min(3, widths[i]), alpha=0.6,
                           bos_id=BOS, eos_id=EOS, max_len_a=1.5, max_len_b=5,
                           rules=RULES[i % 3])[0]
        got = b.hypotheses()
        assert [h for h, _ in got] == [h for h, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-5)


def test_top_k_of_wide_rows_equals_topk_wherever_the_largest_entries_sit():
    from vaswani.engine.beam import top_k

    torch.manual_seed(0)
    x = torch.randn(40, 6000, device=DEVICE).log_softmax(-1)
    x[:, [0, 1]] = float("-inf")  # <pad> and <bos>, never chosen
    width = 6000 // 8
    x[1, torch.arange(8) * width + 5] = torch.arange(8.0) + 10  # all in one column
    x[2, 3000:3008] = torch.arange(8.0) + 10  # side by side, in one group
    for rows, k in ((x, 8), (x, 3), (x[:, :1000], 8), (x[:, :1001], 8), (x[:, :64], 8)):
        want, got = rows.topk(k, dim=-1), top_k(rows, k)
        assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)


def test_beam_scores_are_log_probabilities_written_over_the_callers_logits():
    """A beam step's log-softmax writes into the step's logits (no second (N, V) tensor to
    allocate and write each step), with the bits a new tensor would have."""
    from vaswani.engine.request import Params, Request, Sequence
    from vaswani.engine.sampler import Sampler

    torch.manual_seed(0)
    logits = torch.randn(5, 6000, device=DEVICE)
    want = logits.clone()
    want[:, [0, 1]] = float("-inf")  # <pad> and <bos>, never chosen
    want = want.log_softmax(-1)
    rows = [(Request([3], Params(max_new_tokens=4, beam=2)), Sequence([1])) for _ in range(5)]
    got = Sampler(pad_id=0, bos_id=1, eos_id=2, device=DEVICE).scores(rows, logits, log=True)
    assert got.data_ptr() == logits.data_ptr()
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["every row in order", "rows in another order",
                                  "searches of unlike sizes"])
def test_rank_gives_each_searchs_best_candidates_as_one_search_alone_would(case):
    """``rank`` ranks every search's candidates at once; each search's are those a top-k
    over its own rows' (score + log-probability) finds, best first, in float64: with every
    search's rows in the logits' order (no rows picked), in another order, and with
    searches of fewer rows than others (a grid padded with -inf)."""
    from vaswani.engine.beam import rank

    g = torch.Generator().manual_seed(0)
    sizes = [3, 1, 2, 3] if case == "searches of unlike sizes" else [3, 3, 3]
    beams = [3] * len(sizes)
    N = sum(sizes)
    logp = torch.randn(N + 2, 500, generator=g).log_softmax(-1).to(DEVICE)
    at = list(range(N))
    if case != "every row in order":
        at = random.Random(0).sample(range(N + 2), N)  # rows among others, shuffled
    else:
        logp = logp[:N]
    scores = (torch.rand(N, generator=g, dtype=torch.float64) * -10).tolist()
    got = rank(sizes, beams, scores, logp, at)
    first = 0
    for (values, index), n, K in zip(got, sizes, beams, strict=True):
        rows = logp[at[first:first + n]].double()  # (n, V) this search's
        candidates = (torch.tensor(scores[first:first + n], dtype=torch.float64,
                                   device=DEVICE)[:, None] + rows).view(-1)
        top = candidates.topk(min(2 * K, candidates.numel()))
        assert index[:len(top.indices)] == top.indices.tolist()
        assert values[:len(top.values)] == top.values.tolist()
        assert all(v == float("-inf") for v in values[len(top.values):])
        first += n


def test_shared_is_the_common_prefix_of_what_two_slots_hold():
    from vaswani.engine.beam import shared
    from vaswani.engine.request import Sequence

    def row(tokens, cached, offset=0):
        s = Sequence(tokens)
        s.cached, s.offset = cached, offset
        return s

    a = row([1, 5, 6, 7, 8, 9], 5)
    assert shared(a, row([1, 5, 6, 7, 8, 3], 5)) == 5  # all that both hold
    assert shared(a, row([1, 5, 6, 4, 8, 9], 5)) == 3
    assert shared(a, row([1, 5, 6, 7], 2)) == 2  # within what each has cached
    assert shared(a, row([2, 5, 6, 7, 8, 9], 5)) == 0
    assert shared(a, row([1, 5, 6, 7, 8, 9], 5, offset=1)) == 0  # other positions
    assert shared(a, row([1, 5, 6, 7, 8, 9], 0)) == 0
    rng = random.Random(0)
    for _ in range(300):  # the search against a plain scan, parting anywhere
        n = rng.randint(1, 70)
        x = [rng.randint(3, 9) for _ in range(n)]
        y = x[:rng.randint(0, n)] + [rng.randint(3, 9) for _ in range(n)]
        y = y[:n]
        want = next((i for i, (p, q) in enumerate(zip(x, y, strict=True)) if p != q), n)
        assert shared(row(x, n), row(y, n)) == want


def test_beam_forks_copy_only_what_their_slot_lacks_and_decode_as_full_copies(monkeypatch):
    """A fork's slot holds its parent's prefix up to where the two hypotheses part: only
    the rest is copied (a fraction of the keys), and the hypotheses equal those of full
    copies (a request marked recomputed copies everything)."""
    from vaswani.engine.cache import SlotCache

    mt = model("encoder-decoder")
    sources = [s + [EOS] for s in prompts(8, seed=6, low=6)]
    copied = []  # columns copied into forks' slots
    fork = SlotCache.fork
    monkeypatch.setattr(SlotCache, "fork", lambda self, forks: (
        copied.append(sum(max(0, n - start) for *_, start, n in forks)), fork(self, forks))[1])

    def run(recomputed):
        copied.clear()
        requests = [Request(s, Params(max_new_tokens=0, beam=4, n_best=4), start=[BOS],
                            history_start=1, limit=30) for s in sources]
        for r in requests:
            r.recomputed = recomputed
        engine(mt, max_rows=32).run(requests)
        return [r.hypotheses() for r in requests], sum(copied)

    (shared_out, few), (full_out, many) = run(False), run(True)
    assert shared_out == full_out and 0 < few < many / 2, (few, many)


def test_long_prompts_are_prefilled_in_chunks_and_slide_past_max_len():
    lm = model("decoder")
    cases = [(p, Params(max_new_tokens=30)) for p in prompts(6, seed=2, low=20, high=60)]
    requests = [lm_request(p, params) for p, params in cases]
    eng = engine(lm, max_rows=3, max_step_tokens=7)  # chunks of at most 7 prompt tokens
    eng.run(requests)
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.output == alone(lm, p, params)  # > max_len (40): sliding windows


def test_an_offline_run_makes_its_slots_as_wide_as_its_rows_can_grow():
    """``Engine.run`` knows every prompt and limit: its cache is made that wide (prompts of
    at most 20 tokens and 5 new ones: 32 columns, against the 48 of the model's full
    length), and the outputs are those of each request alone."""
    lm = model("decoder")
    cases = [(p, Params(max_new_tokens=5)) for p in prompts(6, seed=4, low=3, high=20)]
    assert 16 <= max(len(p) for p, _ in cases) + 5 < 31
    requests = [lm_request(p, params) for p, params in cases]
    eng = engine(lm, max_rows=8)
    assert eng.cache.initial[0] == 48
    eng.run(requests)
    assert eng.cache.width == 32 and eng.cache.resizes == 2  # made at the start, then once
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.output == alone(lm, p, params)


def test_a_tiny_cache_preempts_and_still_answers_everything_exactly():
    lm = model("decoder")
    cases = [(p, Params(max_new_tokens=25, temperature=0.9, seed=i))
             for i, p in enumerate(prompts(10, seed=3))]
    requests = [lm_request(p, params) for p, params in cases]
    eng = engine(lm, max_rows=10, cache_tokens=96)  # 2 full-length rows (of 48 positions)
    assert eng.cache.width == 16  # slots start narrow: 6 of them
    eng.run(requests)
    assert eng.cache.resizes > 1 and eng.scheduler.preemptions > 0  # widened, preempted
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.output == alone(lm, p, params)
    assert eng.cache.used == 0  # every slot came back
    eng.step()  # idle: the slots narrow again
    assert eng.cache.width == 16


def test_beams_share_and_return_their_blocks_under_preemption():
    mt = model("encoder-decoder")
    sources = [s + [EOS] for s in prompts(6, seed=4, low=5)]
    requests = [Request(s, Params(max_new_tokens=0, beam=3, n_best=2), start=[BOS],
                        history_start=1, limit=20) for s in sources]
    eng = engine(mt, max_rows=12, cache_tokens=192)  # two full-length rows and sources
    eng.run(requests)
    for s, r in zip(sources, requests, strict=True):
        want = beam_decode(mt, torch.tensor([s], device=DEVICE), beam=3, n_best=2, alpha=0.0,
                           bos_id=BOS, eos_id=EOS, max_len_a=0, max_len_b=20)[0]
        assert [h for h, _ in r.hypotheses()] == [h for h, _ in want]
    assert eng.cache.used == eng.cache.sources_used == 0  # every slot came back


def test_cancelling_mid_stream_frees_the_blocks_at_once():
    lm = model("decoder")
    seen = []
    victim = Request([5, 6, 7], Params(max_new_tokens=30),
                     on_token=lambda r, t: seen.append(t) or False)
    other = Request([8, 9], Params(max_new_tokens=30))
    eng = engine(lm)
    eng.submit(victim), eng.submit(other)
    while len(seen) < 3:
        eng.step()
    used = eng.cache.used
    victim.cancel()
    finished = eng.step()
    assert victim in finished and victim.reason == "cancelled"
    assert eng.cache.used < used and len(victim.output) == 3
    eng.run([])
    while eng.busy:
        eng.step()
    assert other.output == generate(lm, [8, 9], max_new_tokens=30, bos_id=BOS, eos_id=EOS,
                                    temperature=0)


def arrive_at_random(eng, requests, rng, *, steps, cancel):
    """Submit ``requests`` one by one, 0 .. ``steps`` engine steps apart, after each
    cancelling one submitted so far with probability ``cancel``; step until all have
    finished. Returns how many times each finished, by id."""
    finishes: dict[int, int] = {}
    for request in requests:
        request.on_finish = lambda r: finishes.update({r.id: finishes.get(r.id, 0) + 1})
    for i, request in enumerate(requests):
        eng.submit(request)
        for _ in range(rng.randint(0, steps)):
            eng.step()
        if rng.random() < cancel:
            rng.choice(requests[:i + 1]).cancel()
    while eng.busy:
        eng.step()
    return finishes


def test_200_random_arrivals_and_cancellations_finish_each_request_exactly_once():
    lm = model("decoder")
    rng = random.Random(5)
    eng = engine(lm, max_rows=6, cache_tokens=120)
    cases = [(p, Params(max_new_tokens=rng.randint(1, 20), temperature=rng.choice([0, 0.8]),
                        seed=i)) for i, p in enumerate(prompts(200, seed=6))]
    requests = [Request(p, params) for p, params in cases]
    finishes = arrive_at_random(eng, requests, rng, steps=2, cancel=0.2)
    assert any(r.reason == "cancelled" for r in requests)
    assert sorted(finishes) == sorted(r.id for r in requests)
    assert set(finishes.values()) == {1}
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.status is Status.FINISHED
        if request.reason != "cancelled":
            assert request.output == alone(lm, p, params)
    assert eng.cache.used == 0


def test_a_request_no_cache_could_hold_fails_alone():
    lm = model("decoder")
    eng = engine(lm, cache_tokens=96)  # 2 full rows of max_len 40 (48 positions each)
    small = Request([5, 6], Params(max_new_tokens=3))
    big = Request([5] * 20, Params(max_new_tokens=40))
    eng.run([small])
    assert small.output and small.error is None
    huge = Request([5, 6], Params(max_new_tokens=5, beam=40))
    eng.run([big, huge])
    assert big.error is None and big.output
    assert huge.reason == "error" and "cannot hold this request" in str(huge.error)
    # the budget, not max_len, sizes the cache: a row longer than it holds fails alone
    eng = engine(lm, cache_tokens=32)
    short, long = (Request(p, Params(max_new_tokens=3)) for p in ([5, 6], [5] * 35))
    eng.run([short, long])
    assert short.output and short.error is None
    assert long.reason == "error" and "cannot hold this request" in str(long.error)


def test_a_request_that_fits_narrow_slots_waits_out_wide_ones_instead_of_failing():
    lm = model("decoder")
    eng = engine(lm, max_rows=10, cache_tokens=96)  # slots of 48 tokens: 2; of 16: 6
    long = Request([5] * 35, Params(max_new_tokens=4))
    eng.submit(long)
    eng.step()
    assert eng.cache.width == 48 and eng.cache.rows == 2
    beams = Request([5, 6], Params(max_new_tokens=4, beam=3))  # 3 rows: only narrow ones
    eng.run([beams])
    assert beams.error is None and beams.reason == "stop" and beams.hypotheses()
    assert long.output == alone(lm, [5] * 35, long.params)


def test_prefill_rows_of_unlike_lengths_run_apart_shortest_first():
    from vaswani.engine.engine import prefill_groups

    rows = [(None, None, n) for n in (200, 5, 20, 190, 8)]
    assert [[r[2] for r in g] for g in prefill_groups(rows)] == [[5, 8, 20], [190, 200]]
    assert [[r[2] for r in g] for g in prefill_groups(rows, slack=0)] == [
        [5, 8], [20], [190, 200]]
    lm = model("decoder", max_len=256)
    eng = engine(lm, max_rows=8, max_step_tokens=1024, shared_chunk=0,
                 prefix_bytes=0)  # offline: no turns, no prefixes kept
    passes = []
    forward = eng.runner.forward
    eng.runner.forward = lambda rows: passes.append([n for _, _, n in rows]) or forward(rows)
    cases = [([5 + i % 7 for i in range(n)], Params(max_new_tokens=4))
             for n in (150, 3, 140, 6)]
    requests = [Request(p, params) for p, params in cases]
    eng.run(requests)
    assert passes[0] == [3, 6] and passes[1] == [140, 150]  # one step, two passes
    wide = engine(lm, max_rows=8, max_step_tokens=1024, shared_chunk=0, prefix_bytes=0,
                  prefill_slack=1 << 30)  # padding no concern: one pass
    passes.clear()
    forward = wide.runner.forward
    wide.runner.forward = lambda rows: passes.append([n for _, _, n in rows]) or forward(rows)
    again = [Request(p, params) for p, params in cases]
    wide.run(again)
    assert passes[0] == [3, 6, 140, 150]
    assert [r.output for r in again] == [r.output for r in requests]
    with pytest.raises(ValueError, match=r"prefill_slack \(-1\)"):
        EngineConfig(prefill_slack=-1)
    for (p, params), r in zip(cases, requests, strict=True):
        assert r.output == alone(lm, p, params)


def test_sources_pad_a_sixteenth_of_a_pass_where_prompts_pad_a_quarter():
    """Sources of 3, 20, 38 and 40 tokens: a prompt's rule (a quarter of the tokens and 32
    positions) would pad 3 to 20 in one pass; the encoder's (a sixteenth and 8: config.py
    ``SOURCE_SHARE``, ``SOURCE_SLACK``), each padded position costing as much as a token,
    keeps them apart, and 38 with 40."""
    from vaswani.engine.config import SOURCE_SHARE, SOURCE_SLACK
    from vaswani.engine.scheduler import length_groups

    lengths = [20, 3, 40, 38]
    assert length_groups(lengths, int) == [[3, 20], [38, 40]]
    assert length_groups(lengths, int, SOURCE_SLACK, share=SOURCE_SHARE) == [
        [3], [20], [38, 40]]


@pytest.mark.parametrize("lengths,passes", [
    ((30, 3, 32, 4), [[3, 4], [30, 32]]),  # padding all to 32 would waste half the work
    ((20, 3, 40, 38), [[3], [20], [38, 40]]),  # (a prompt's rule: [3, 20], [38, 40])
])
def test_sources_of_unlike_lengths_are_encoded_apart_and_translate_as_alone(lengths, passes):
    """A step that admits sources of unlike lengths encodes them in passes of like lengths
    (the rule above), and each translation is its reference decoder's."""
    mt = model("encoder-decoder", max_len=64)
    eng = engine(mt, max_rows=8)
    seen = []
    encode = eng.runner.encode
    eng.runner.encode = lambda group: seen.append([len(r.prompt) for r in group]) or \
        encode(group)
    sources = [[5 + i % 7 for i in range(n - 1)] + [EOS] for n in lengths]
    requests = [Request(s, Params(max_new_tokens=0), start=[BOS], history_start=1, limit=6)
                for s in sources]
    eng.run(requests)
    assert seen == passes
    for s, r in zip(sources, requests, strict=True):
        src = torch.tensor([s], device=DEVICE)
        assert r.output == greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=0,
                                         max_len_b=6)[0]


def test_many_sources_are_encoded_in_passes_within_max_step_tokens():
    """A step that admits 20 sources of 9-12 tokens encodes them in passes of at most
    ``max_step_tokens`` padded positions (one pass of all 240 would make activations many
    times a pass's), a source longer than that alone, and each translation is its reference
    decoder's."""
    mt = model("encoder-decoder", max_len=64)
    eng = engine(mt, max_rows=32, max_step_tokens=48)
    passes = []
    encode = eng.runner.encode
    eng.runner.encode = lambda group: passes.append([len(r.prompt) for r in group]) or \
        encode(group)
    rng = random.Random(5)
    sources = [[rng.randint(3, 22) for _ in range(rng.randint(8, 11))] + [EOS]
               for _ in range(20)] + [[7] * 59 + [EOS]]
    requests = [Request(s, Params(max_new_tokens=0), start=[BOS], history_start=1, limit=5)
                for s in sources]
    eng.run(requests)
    assert sorted(n for p in passes for n in p) == sorted(map(len, sources))
    assert all(len(p) * max(p) <= 48 for p in passes if p != [60]) and [60] in passes
    assert len(passes) >= 240 // 48 + 1
    for s, r in zip(sources, requests, strict=True):
        src = torch.tensor([s], device=DEVICE)
        assert r.output == greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=0,
                                         max_len_b=5)[0]


def test_an_offline_run_admits_new_requests_in_groups_and_translates_as_alone():
    """Engine.run over more requests than rows: once the first rows are running, the waiting
    ones join only when an eighth of the rows are free, a group at a time (one encoder pass
    for the group, not one per row that finishes), and every output is its reference's; an
    engine stepped by hand (a server's) admits each as soon as a row is free."""
    mt = model("encoder-decoder", max_len=64)
    rng = random.Random(7)
    sources = [[rng.randint(3, 22) for _ in range(rng.randint(2, 9))] + [EOS]
               for _ in range(60)]

    def requests():
        return [Request(s, Params(max_new_tokens=0), start=[BOS], history_start=1,
                        limit=2 + i % 29) for i, s in enumerate(sources)]

    def admitted(eng):  # requests admitted, per step that admits any
        counts = []
        plan = eng.scheduler.plan
        eng.scheduler.plan = lambda: (p := plan()).encode and counts.append(len(p.encode)) or p
        return counts

    eng = engine(mt, max_rows=32)  # an offline run gathers 32 // 8 = 4 rows
    counts, offline = admitted(eng), requests()
    eng.run(offline)
    assert sum(counts) == 60 and counts[0] == 32 and eng.scheduler.gather == 0  # put back
    assert min(counts[1:-1]) >= 4, counts
    for s, r in zip(sources, offline, strict=True):
        src = torch.tensor([s], device=DEVICE)
        assert r.output == greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=0,
                                         max_len_b=r.limit)[0]
    eng = engine(mt, max_rows=32)
    counts, served = admitted(eng), requests()
    for r in served:
        eng.submit(r)
    while eng.busy:
        eng.step()
    assert min(counts[1:]) < 4, counts
    assert [r.output for r in served] == [r.output for r in offline]


def test_a_step_over_short_and_long_sources_reads_them_in_parts_and_decodes_as_alone():
    """Many sources of 2-4 and of 50-60 tokens decoded together (greedy, and beam searches
    whose rows share their source): the step's cross-attention runs in parts, each reading
    its own sources' length of keys (cache.py ``SlotCache.parts``), and every output is the
    reference decoder's."""
    mt = model("encoder-decoder", max_len=64)
    rng = random.Random(3)
    sources = [[rng.randint(3, 22) for _ in range(rng.choice([2, 3, 4, 50, 60]))] + [EOS]
               for _ in range(80)]
    sources.sort(key=len)  # as the offline commands submit them
    requests = [Request(s, Params(max_new_tokens=0, beam=2 if i % 3 == 0 else 0),
                        start=[BOS], history_start=1, limit=8)
                for i, s in enumerate(sources)]
    eng = engine(mt, max_rows=128)
    used = []
    parts = eng.cache.parts
    eng.cache.parts = lambda: used.append(parts()) or used[-1]
    eng.run(requests)
    if eng.runner.static is None:  # a CUDA graph reads one padded width of keys for all rows
        assert any(p is not None and len(p) > 1 for p in used)
    for s, r in zip(sources, requests, strict=True):
        src = torch.tensor([s], device=DEVICE)
        if r.params.beam:
            want = beam_decode(mt, src, beam=2, bos_id=BOS, eos_id=EOS, max_len_a=0,
                               max_len_b=8)[0]
            assert r.hypotheses()[0][0] == want[0][0]
        else:
            assert r.output == greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=0,
                                             max_len_b=8)[0]


def test_rows_of_short_and_long_contexts_attend_in_parts_and_decode_as_alone(monkeypatch):
    """Prompts of 2-7 and of 40-50 tokens continued together, longest first (as
    generate_many hands them in), greedy and seeded sampling: each step's self-attention
    runs in parts, each reading its own rows' context of keys (cache.py ``parts``), and every
    output is the reference decoder's."""
    import vaswani.engine.runner

    lm = model("decoder", max_len=64)
    rng = random.Random(5)
    prompts_ = [[rng.randint(3, 22) for _ in range(rng.choice([2, 3, 4, 5, 6, 7, 40, 50]))]
                for _ in range(80)]
    requests = [Request(p, Params(max_new_tokens=6, temperature=0.8 if i % 4 == 0 else 0.0,
                                  seed=i))
                for i, p in enumerate(prompts_)]
    used = []
    parts = vaswani.engine.runner.parts
    monkeypatch.setattr(vaswani.engine.runner, "parts",
                        lambda lengths: used.append(parts(lengths)) or used[-1])
    engine(lm, max_rows=128).run(sorted(requests, key=lambda r: -len(r.prompt)))
    if DEVICE.type == "cpu":  # a CUDA graph reads one padded width of keys for all rows
        assert any(p is not None and len(p) > 1 for p in used)
    for p, r in zip(prompts_, requests, strict=True):
        assert r.output == alone(lm, p, r.params)


def test_a_decode_step_in_self_attention_parts_gives_the_one_pass_logits(monkeypatch):
    """The same decode step (rows of 3-8 and of 41-51 tokens of context) with its
    self-attention in parts and in one pass: the same logits (a part that read too few keys
    would change them)."""
    import vaswani.engine.runner

    lm = model("decoder", max_len=64)
    rng = random.Random(6)
    eng = engine(lm, max_rows=64)
    for n in sorted([rng.randint(40, 50) for _ in range(12)] + [rng.randint(2, 7)
                                                                for _ in range(40)],
                    reverse=True):
        eng.submit(Request([rng.randint(3, 22) for _ in range(n)], Params(max_new_tokens=9)))
    for _ in range(3):
        eng.step()
    rows = [(r, s) for r in eng.scheduler.running for s in r.sequences
            if len(s.uncached()) == 1]
    assert len(rows) == 52
    found = vaswani.engine.runner.parts([s.cached + 1 for _, s in rows])
    assert found is not None and len(found) > 1
    in_parts, at = eng.runner.decode(rows)
    monkeypatch.setattr(vaswani.engine.runner, "parts", lambda lengths: None)
    one_pass, at_too = eng.runner.decode(rows)
    assert at == at_too
    torch.testing.assert_close(in_parts, one_pass)


def test_a_seed_out_of_range_is_refused_when_submitted():
    """The bound is the one the HTTP schema holds a seed to (config.sections.MAX_SEED)."""
    eng = engine(model("decoder"))
    with pytest.raises(ValueError, match=r"seed \(1180591620717411303424\) must be in"):
        eng.submit(Request([5], Params(max_new_tokens=2, temperature=1.0, seed=2**70)))
    with pytest.raises(ValueError, match=r"seed \(-1\) must be in"):
        eng.submit(Request([5], Params(max_new_tokens=2, temperature=1.0, seed=-1)))
    eng.submit(Request([5], Params(max_new_tokens=2, temperature=1.0, seed=MAX_SEED)))


def test_random_translations_and_cancellations_keep_every_source_with_its_rows():
    """Greedy and beam translations arriving, finishing and cancelled at random in a cache
    small enough to preempt: rows and source slots are compacted apart and re-paired every
    step; each request finishes once, as its reference decoder would translate it alone."""
    mt = model("encoder-decoder")
    rng = random.Random(7)
    eng = engine(mt, max_rows=10, cache_tokens=200)
    requests = [Request(s + [EOS], Params(max_new_tokens=0, beam=rng.choice([0, 0, 2, 3])),
                        start=[BOS], history_start=1, limit=rng.randint(5, 30))
                for s in prompts(40, seed=8, low=2)]
    finishes = arrive_at_random(eng, requests, rng, steps=3, cancel=0.15)
    assert eng.scheduler.preemptions > 0 and any(r.reason == "cancelled" for r in requests)
    assert sorted(finishes) == sorted(r.id for r in requests)
    assert set(finishes.values()) == {1}
    assert eng.cache.used == eng.cache.sources_used == 0
    for r in requests:
        if r.reason == "cancelled":
            continue
        src = torch.tensor([r.prompt], device=DEVICE)
        if r.beam is None:
            want = greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=0,
                                 max_len_b=r.limit)[0]
            assert r.output == want
        else:
            want = beam_decode(mt, src, beam=r.params.beam, n_best=1, alpha=0.0, bos_id=BOS,
                               eos_id=EOS, max_len_a=0, max_len_b=r.limit)[0]
            assert [h for h, _ in r.hypotheses()] == [h for h, _ in want]


def test_a_long_prefill_takes_turns_with_short_work_by_time():
    """shared_chunk (a server's engine): a 200-token prompt beside short requests runs in
    chunks of 16 in steps of its own, and a chunk runs only when the chunks so far have taken
    no longer than the short requests' steps; the short ones finish before the long prompt's
    first token, and every output is what it is alone."""
    lm = model("decoder", max_len=256)
    eng = engine(lm, max_rows=8, max_step_tokens=64, shared_chunk=16)
    long = Request([5 + i % 7 for i in range(200)], Params(max_new_tokens=3))
    eng.submit(long)
    eng.step()  # alone: a whole step's 64 tokens; in chunks of 16 once others come
    shorts = [Request([6, 7, 8], Params(max_new_tokens=6)) for _ in range(2)]
    for r in shorts:
        eng.submit(r)
    turns = []
    took = eng.scheduler.took

    def timed(plan, seconds=None):  # a chunk costs 4 units, a short step 1: turns by time
        turns.append(plan.turn)
        if plan.turn == "long":
            assert not plan.decode and all(n <= 16 for _, _, n in plan.prefill)
        took(plan, 4.0 if plan.turn == "long" else 1.0)
    eng.scheduler.took = timed
    while any(r.status is not Status.FINISHED for r in shorts):
        eng.step()
    assert long.first_token is None  # the short ones were not held to its prefill
    shared = [t for t in turns if t is not None]
    assert shared.count("others") >= 3 * shared.count("long") >= 3  # 4 units against 1
    eng.scheduler.took = took
    while long.status is not Status.FINISHED:
        eng.step()
    for r in [*shorts, long]:
        assert r.output == alone(lm, r.prompt, r.params)


def test_prompts_that_fit_a_step_are_prefilled_beside_decoding_not_in_turns():
    """A prompt longer than shared_chunk but within a step's budget is no long prefill: with
    rows already decoding, eight such prompts are prefilled, whole, in the next steps beside
    the decoding (no turn, no chunk of 16), and each output is what it is alone."""
    lm = model("decoder", max_len=256)
    eng = engine(lm, max_rows=16, max_step_tokens=64, shared_chunk=16, prefix_bytes=0)
    first = Request([6, 7, 8], Params(max_new_tokens=20))
    eng.submit(first)
    eng.step()
    assert first.first_token is not None  # decoding from here on
    g = torch.Generator().manual_seed(0)
    prompts = [Request(torch.randint(3, 23, (30 + i,), generator=g, device="cpu").tolist(),
                       Params(max_new_tokens=3)) for i in range(8)]
    for r in prompts:
        eng.submit(r)
    plans = []
    plan_step = eng.scheduler.plan

    def noted(*args, **kwargs):
        plans.append(plan_step(*args, **kwargs))
        return plans[-1]

    eng.scheduler.plan = noted
    while any(r.first_token is None for r in prompts):
        eng.step()
    assert all(p.turn is None and not p.long for p in plans)
    assert all(p.decode for p in plans)  # the running row decoded at every step
    chunks = [n for p in plans for _, _, n in p.prefill]
    # every prompt token prefilled (but a last one, which may ride in a decoding step)
    assert sum(chunks) >= sum(len(r.prompt) - 1 for r in prompts) and max(chunks) > 16
    assert len(plans) <= 6  # 276 tokens in steps of 64 at most, not 16 a turn
    eng.scheduler.plan = plan_step
    while any(r.status is not Status.FINISHED for r in [first, *prompts]):
        eng.step()
    for r in [first, *prompts]:
        assert r.output == alone(lm, r.prompt, r.params)


def test_an_offline_run_hands_in_the_longest_prompts_first_and_each_decodes_as_alone():
    """run(longest_first=True) (translate, generate_many, a validation metric) submits by prompt
    length, longest first, on an offline config (no fast lane, no shared chunk, wide
    steps), and every request still gets what it gets alone."""
    lm = model("decoder")
    config = EngineConfig.offline(8)
    assert (config.fast_lane, config.shared_chunk, config.max_step_tokens) == (0, 0, 4096)
    assert EngineConfig.offline(8, max_step_tokens=64).max_step_tokens == 64
    eng = Engine(lm, bos_id=BOS, eos_id=EOS, config=config)
    submitted, submit = [], eng.submit
    eng.submit = lambda r: submitted.append(len(r.prompt)) or submit(r)
    params = Params(max_new_tokens=6)
    requests = [lm_request(p, params) for p in prompts(6, seed=3)]
    eng.run(requests, longest_first=True)
    assert submitted == sorted(submitted, reverse=True) and len(set(submitted)) > 1
    for r in requests:
        assert r.output == alone(lm, r.prompt, params)


def test_an_offline_run_makes_its_cache_once_for_the_rows_it_knows(monkeypatch):
    """``Engine.run`` knows its requests' rows: the cache's tensors are made once for them
    (each remake is faulted in and zeroed anew), not doubled slot by slot as they come in;
    the answers are each request's alone."""
    import vaswani.engine.cache as cache

    made = []
    zeros = cache.zeros_in_huge_pages
    monkeypatch.setattr(cache, "zeros_in_huge_pages",
                        lambda shape, *a: made.append(shape[0]) or zeros(shape, *a))
    lm = model("decoder")
    cases = [(p, Params(max_new_tokens=8)) for p in prompts(20, seed=4)]
    requests = [lm_request(p, params) for p, params in cases]
    eng = engine(lm, max_rows=32)
    made.clear()
    eng.run(requests)
    assert made == [20] * 4  # every layer's keys and values made once, for the 20 rows,
    #                          never grown by doubling as the requests come in
    for (p, params), request in zip(cases, requests, strict=True):
        assert request.output == alone(lm, p, params)


class RoundedKV(KV):
    """A reference cache entry that keeps its keys and values rounded to bfloat16 and hands
    them back in float32, as the engine's bfloat16 cache does."""

    def __setattr__(self, name, value):
        if name in ("k", "v") and value is not None:
            value = value.to(torch.bfloat16).to(value.dtype)
        super().__setattr__(name, value)

    def append(self, k, v):
        super().append(k, v)
        return self.k, self.v  # this step's own keys as the cache holds them


@torch.inference_mode()
def stepwise_logprobs(lm, prompt, output):
    """Each of ``output``'s tokens' log-probability after ``prompt``, decoding one token a
    step over the model's own cache (nn/kv_cache.py)."""
    cache, ids, out = lm.new_cache(), torch.tensor([prompt], device=DEVICE), []
    for token in output:
        positions, mask = cache.inputs(ids)
        logits = lm.decode_step(ids, positions=positions, mask=mask, cache=cache,
                                last=torch.tensor([ids.size(1) - 1], device=DEVICE))
        out.append(float(logits[0].float().log_softmax(-1)[token]))
        ids = torch.tensor([[token]], device=DEVICE)
    return out


def test_a_bfloat16_cache_decodes_over_keys_rounded_to_bfloat16(monkeypatch):
    """EngineConfig.cache_dtype=torch.bfloat16: the keys and values in half the bytes (twice
    the tokens in the same memory), read back in float32: each request's tokens and
    log-probabilities are those of the reference whose cache rounds every key and value to
    bfloat16, and not those of a float cache."""
    lm = model("decoder")
    floats = engine(lm, max_rows=8, cache_bytes=1 << 20, prefix_bytes=0)
    half = engine(lm, max_rows=8, cache_bytes=1 << 20, prefix_bytes=0,
                  cache_dtype=torch.bfloat16)
    assert half.cache.k[0].dtype == torch.bfloat16 and floats.cache.k[0].dtype == torch.float32
    assert half.cache.tokens == 2 * floats.cache.tokens
    cases = prompts(6, seed=3, low=4)
    requests = [Request(p, Params(max_new_tokens=12, logprobs=1)) for p in cases]
    half.run(requests)
    apart = 0.0
    for p, request in zip(cases, requests, strict=True):
        got = [logprob for logprob, _ in request.logprobs]
        want_float = stepwise_logprobs(lm, p, request.output)
        with monkeypatch.context() as patch:
            patch.setattr(kv_cache, "KV", RoundedKV)
            want = stepwise_logprobs(lm, p, request.output)
            assert request.output == alone(lm, p, Params(max_new_tokens=12))
        assert got[:len(want)] == pytest.approx(want, abs=2e-6)
        apart = max(apart, *(abs(a - b) for a, b in zip(got, want_float, strict=False)))
    assert apart > 1e-4  # the rounding is there: a float cache's log-probabilities differ


def test_a_translator_over_a_bfloat16_cache_decodes_as_the_reference_over_rounded_keys(
        monkeypatch):
    """A translator's engine with its keys, values and sources' keys in bfloat16: greedy and
    beam search give the reference decoders' outputs over a cache that rounds them too."""
    mt = model("encoder-decoder", vocab_size=640)
    sources = [s + [EOS] for s in prompts(8, seed=5, low=3)]
    greedy = [Request(s, Params(max_new_tokens=0), start=[BOS], history_start=1,
                      limit=int(1.5 * len(s) + 5)) for s in sources]
    beams = [Request(s, Params(max_new_tokens=0, beam=3, n_best=2), start=[BOS],
                     history_start=1, limit=int(1.5 * len(s) + 5)) for s in sources]
    half = engine(mt, max_rows=32, cache_dtype=torch.bfloat16)
    half.run(greedy + beams)
    assert half.cache.ck[0].dtype == half.cache.k[0].dtype == torch.bfloat16
    monkeypatch.setattr(kv_cache, "KV", RoundedKV)
    for s, g, b in zip(sources, greedy, beams, strict=True):
        src = torch.tensor([s], device=DEVICE)
        assert g.output == greedy_decode(mt, src, bos_id=BOS, eos_id=EOS, max_len_a=1.5,
                                         max_len_b=5)[0]
        want = beam_decode(mt, src, beam=3, n_best=2, alpha=0.0, bos_id=BOS, eos_id=EOS,
                           max_len_a=1.5, max_len_b=5)[0]
        assert [h for h, _ in b.hypotheses()] == [h for h, _ in want]
