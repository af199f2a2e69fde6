import itertools

import pytest
import torch
from torch.testing import assert_close

from vaswani import ModelConfig, build_model
from vaswani.generation import (
    LMStepper,
    Seq2SeqStepper,
    beam_decode,
    beam_search,
    decode_loop,
    generate,
    greedy_decode,
    length_penalty,
    sample_next,
)
from vaswani.nn import masks

PAD, BOS, EOS = 0, 1, 2
SMALL = dict(d_model=16, n_heads=4, d_ff=32, n_layers=2, dropout=0.0, max_len=40)


def model(arch, vocab=13, **kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(arch=arch, vocab_size=vocab, **{**SMALL, **kw})).double().eval()


def padded_sources(lengths, vocab=13, seed=1):
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    src = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(3, vocab, (n,), generator=g)
    return src


def step(m, ids, cache):
    """A language model's logits at every new token, decoded over ``cache``."""
    positions, mask = cache.inputs(ids)
    return m.decode_step(ids, positions=positions, mask=mask, cache=cache)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_logits_equal_uncached_at_every_step_encoder_decoder(positional, norm_first):
    m = model("encoder-decoder", positional=positional, norm_first=norm_first, n_kv_heads=2)
    src = padded_sources([7, 4])
    tgt = torch.cat([torch.full((2, 1), BOS), torch.randint(3, 13, (2, 9))], dim=1)
    src_mask = src != PAD
    memory = m.encode(src, src_mask=src_mask)
    full = m.decode(tgt, memory, src_mask=src_mask)  # (B, T, V), all at once
    cache = m.new_cache()
    for t in range(tgt.size(1)):
        positions, mask = cache.inputs(tgt[:, t:t + 1])
        step = m.decode_step(tgt[:, t:t + 1], positions=positions, mask=mask, cache=cache,
                             memory=memory if t == 0 else None,  # then the cache holds it
                             memory_mask=masks.key_padding_mask(src_mask))
        assert_close(step[:, 0], full[:, t])
    assert cache.length == tgt.size(1)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_cached_logits_equal_uncached_at_every_step_decoder_lm(positional):
    m = model("decoder", positional=positional, norm_first=True)
    ids = torch.randint(3, 13, (2, 12))
    full = m(ids)
    cache = m.new_cache()
    first = step(m, ids[:, :5], cache)  # a prompt of 5 tokens in one call ...
    assert_close(first, full[:, :5])
    for t in range(5, 12):  # ... then one token at a time
        assert_close(step(m, ids[:, t:t + 1], cache)[:, 0], full[:, t])


def test_several_new_tokens_after_a_cached_prefix_use_a_bottom_right_causal_mask():
    m = model("decoder", norm_first=True)
    ids = torch.randint(3, 13, (2, 9))
    full = m(ids)
    cache = m.new_cache()
    step(m, ids[:, :5], cache)
    assert_close(step(m, ids[:, 5:], cache), full[:, 5:])  # 4 queries over 9 keys


def test_cache_reorder_keeps_chosen_rows():
    m = model("decoder")
    ids = torch.randint(3, 13, (3, 4))
    cache = m.new_cache()
    step(m, ids, cache)
    cache.reorder(torch.tensor([2, 0]))
    new = torch.tensor([[5], [6]])
    expected = m(torch.cat([ids[[2, 0]], new], 1))[:, -1]
    assert_close(step(m, new, cache)[:, 0], expected)


def test_cache_keep_takes_back_the_last_tokens_keys():
    """KVCache.keep(n): as if only the first n tokens had been fed (a draft model's guesses
    that did not hold are taken back so: engine/draft.py)."""
    m = model("decoder", norm_first=True)
    ids = torch.randint(3, 13, (2, 9))
    cache = m.new_cache()
    step(m, ids, cache)
    cache.keep(5)
    assert cache.length == 5
    other = torch.randint(3, 13, (2, 3))  # a different continuation after the kept five
    assert_close(step(m, other, cache), m(torch.cat([ids[:, :5], other], 1))[:, 5:])


def test_greedy_cached_equals_uncached():
    m = model("encoder-decoder")
    src = padded_sources([6, 3, 8])
    assert greedy_decode(m, src, bos_id=BOS, eos_id=EOS) == \
        greedy_decode(m, src, bos_id=BOS, eos_id=EOS, use_cache=False)


def test_beam_of_one_equals_greedy():
    m = model("encoder-decoder")
    src = padded_sources([6, 3, 8, 5])
    greedy = greedy_decode(m, src, bos_id=BOS, eos_id=EOS)
    beam = beam_decode(m, src, beam=1, alpha=0.0, bos_id=BOS, eos_id=EOS)
    assert [hyps[0][0] for hyps in beam] == greedy


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_sentence_alone_equals_the_same_sentence_in_a_batch(search):
    m = model("encoder-decoder")
    src = padded_sources([3, 9, 5, 7])

    def run(batch):
        if search == "greedy":
            return greedy_decode(m, batch, bos_id=BOS, eos_id=EOS)
        return [h[0] for h in beam_decode(m, batch, beam=4, n_best=2, bos_id=BOS, eos_id=EOS)]

    together = run(src)
    for i in range(src.size(0)):
        n = int((src[i] != PAD).sum())
        alone = run(src[i:i + 1, :n])[0]
        if search == "beam":
            assert alone[0] == together[i][0]
            assert alone[1] == pytest.approx(together[i][1], abs=1e-9)
        else:
            assert alone == together[i]


def exhaustive_best(m, src, limit, alpha):
    """Score every possible output (tokens from {eos, 3, 4, 5}, at most `limit` long; a
    sequence without <eos> ends at the limit) by teacher forcing, as beam search scores."""
    vocab = m.config.tgt_vocab_size
    best = (float("-inf"), None)
    src_mask = src != PAD
    memory = m.encode(src, src_mask=src_mask)
    outputs = []
    for n in range(1, limit + 1):
        for body in itertools.product(range(3, vocab), repeat=n - 1):
            outputs.append(list(body) + [EOS])
    outputs += [list(body) for body in itertools.product(range(3, vocab), repeat=limit)]
    for out in outputs:
        tgt = torch.tensor([[BOS] + out[:-1]])
        logits = m.decode(tgt, memory, src_mask=src_mask)[0].clone()
        logits[:, [PAD, BOS]] = float("-inf")
        logp = logits.log_softmax(-1)
        raw = float(sum(logp[i, tok] for i, tok in enumerate(out)).detach())
        score = raw / length_penalty(len(out), alpha)
        if score > best[0]:
            best = (score, [t for t in out if t != EOS])
    return best, len(outputs)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_wide_beam_finds_the_exhaustive_optimum(alpha):
    m = model("encoder-decoder", vocab=6)  # pad, bos, eos + 3 tokens
    src = padded_sources([3], vocab=6, seed=3)
    limit = 4
    (best_score, best_ids), n_outputs = exhaustive_best(m, src, limit, alpha)
    stepper = Seq2SeqStepper(m, src)
    hyps = beam_search(stepper, 1, torch.tensor([limit]), beam=n_outputs, bos_id=BOS,
                       eos_id=EOS, pad_id=PAD, alpha=alpha, n_best=3)[0]
    assert hyps[0][0] == best_ids
    assert hyps[0][1] == pytest.approx(best_score)
    assert hyps[0][1] >= hyps[1][1] >= hyps[2][1]  # n-best sorted
    narrow = beam_search(Seq2SeqStepper(m, src), 1, torch.tensor([limit]), beam=2, bos_id=BOS,
                         eos_id=EOS, pad_id=PAD, alpha=alpha)[0]
    assert narrow[0][1] <= best_score + 1e-12


def sample_decode(model, src, *, bos_id, eos_id, top_k, seed):
    """Sampling a translation per sentence (as greedy_decode does, with sample_next)."""
    stepper = Seq2SeqStepper(model, src)
    generator = torch.Generator(torch.get_default_device()).manual_seed(seed)
    start = torch.full((src.size(0), 1), bos_id, dtype=torch.long)
    limits = (stepper.source_lengths().float() * 1.5 + 10).long().clamp(
        max=model.config.max_len - 1)
    return decode_loop(stepper, start, limits,
                       lambda logits: sample_next(logits, top_k=top_k, generator=generator),
                       eos_id=eos_id, pad_id=model.config.pad_id, bos_id=bos_id)


def test_top_k_one_sampling_equals_greedy():
    m = model("encoder-decoder")
    src = padded_sources([6, 3, 8])
    assert sample_decode(m, src, top_k=1, seed=0, bos_id=BOS, eos_id=EOS) == \
        greedy_decode(m, src, bos_id=BOS, eos_id=EOS)
    lm = model("decoder")
    assert generate(lm, [5, 6], max_new_tokens=10, top_k=1, bos_id=BOS) == \
        generate(lm, [5, 6], max_new_tokens=10, temperature=0, bos_id=BOS)


def test_sampling_is_seedable_and_filters():
    lm = model("decoder")
    a = generate(lm, [5], max_new_tokens=15, seed=7, bos_id=BOS)
    assert a == generate(lm, [5], max_new_tokens=15, seed=7, bos_id=BOS)
    assert a != generate(lm, [5], max_new_tokens=15, seed=8, bos_id=BOS)
    logits = torch.tensor([[3.0, 2.0, 1.0, 0.0]]).repeat(500, 1)
    g = torch.Generator(torch.get_default_device()).manual_seed(0)
    picks = sample_next(logits, top_k=2, generator=g)
    assert set(picks.tolist()) == {0, 1}
    # p(0) = 0.64: top_p 0.5 keeps only token 0; top_p 0.9 keeps tokens 0-2 (0.64+0.24 < 0.9)
    assert set(sample_next(logits, top_p=0.5, generator=g).tolist()) == {0}
    assert set(sample_next(logits, top_p=0.9, generator=g).tolist()) == {0, 1, 2}


def test_generation_past_max_len_slides_the_window_identically_with_and_without_cache():
    lm = model("decoder", max_len=8, positional="learned")
    cached = generate(lm, [5, 6, 7], max_new_tokens=20, temperature=0, bos_id=BOS)
    uncached = generate(lm, [5, 6, 7], max_new_tokens=20, temperature=0, bos_id=BOS,
                        use_cache=False)
    assert len(cached) == 20 and cached == uncached


def test_streaming_callback_sees_every_token():
    lm = model("decoder")
    seen = []
    out = generate(lm, [5], max_new_tokens=6, temperature=0, bos_id=BOS, on_token=seen.append)
    assert seen == out


def test_bad_beam_arguments():
    m = model("encoder-decoder")
    with pytest.raises(ValueError, match="n_best"):
        beam_decode(m, padded_sources([3]), beam=2, n_best=3, bos_id=BOS, eos_id=EOS)
    with pytest.raises(ValueError, match="alpha"):
        beam_search(LMStepper(model("decoder")), 1, torch.tensor([3]), beam=2, bos_id=BOS,
                    eos_id=EOS, pad_id=PAD, alpha=-1)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize("n_best", [1, 2, 4])
def test_a_beam_done_at_its_n_best_returns_what_searching_on_for_k_returns(alpha, n_best):
    """A Beam stops once its n_best best are settled; one that searches on until K
    hypotheses have finished (GNMT's rule, n_best = K) finds the same n_best, on random
    log-probabilities, in as many steps or more."""
    from vaswani.generation.search import Beam

    K, V = 4, 9
    for seed in range(40):
        g = torch.Generator(torch.get_default_device()).manual_seed(seed)
        runs = []
        for n in (n_best, K):
            beam = Beam(K, 12, eos_id=EOS, alpha=alpha, bounded=True, n_best=n)
            g.manual_seed(seed)
            scores, hist, steps = torch.zeros(1, dtype=torch.float64), [[]], 0
            while not beam.done:
                logp = torch.randn(len(hist), V, generator=g, dtype=torch.float64)
                logp[:, EOS] += 1.5  # endings come often enough to matter
                alive = beam.step(steps + 1, scores, logp.log_softmax(-1), hist)
                steps += 1
                hist = [hist[row] + [tok] for row, tok, _ in alive]
                scores = torch.tensor([s for _, _, s in alive], dtype=torch.float64)
            runs.append((beam.best(n_best), steps))
        (early, early_steps), (late, late_steps) = runs
        assert early == late and early_steps <= late_steps, seed


def test_a_beam_refuses_more_hypotheses_returned_than_it_keeps():
    from vaswani.generation.search import Beam

    with pytest.raises(ValueError, match=r"n_best \(5\) must be between 1 and the beam \(4\)"):
        Beam(4, 10, eos_id=EOS, alpha=0.0, bounded=True, n_best=5)
