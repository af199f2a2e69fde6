"""Decoding controls (generation/rules.py) against Hugging Face's logits processors, and
batched generation against generation one prompt at a time."""


import pytest
import torch
from torch.testing import assert_close

from vaswani import ModelConfig, build_model
from vaswani.generation import Rules, beam_decode
from vaswani.generation.rules import banned_by_ngrams

transformers = pytest.importorskip("transformers", reason="transformers is a test dependency")
PAD, BOS, EOS = 0, 1, 2


def scores_and_history(seed=0, n=4, vocab=30, length=12):
    g = torch.Generator(torch.get_default_device()).manual_seed(seed)
    return (torch.randn(n, vocab, generator=g) * 3,
            torch.randint(3, vocab, (n, length), generator=g))


@pytest.mark.parametrize("penalty", [1.3, 0.7])
def test_repetition_penalty_equals_hugging_face(penalty):
    scores, history = scores_and_history()
    hf = transformers.RepetitionPenaltyLogitsProcessor(penalty)(history, scores.clone())
    ours = Rules(repetition_penalty=penalty).apply(scores, history, history, eos_id=EOS,
                                                   pad_id=PAD)
    assert_close(ours, hf)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_no_repeat_ngram_equals_hugging_face(n):
    scores, history = scores_and_history(vocab=6, length=20)  # small vocabulary: repeats
    hf = transformers.NoRepeatNGramLogitsProcessor(n)(history, scores.clone())
    ours = Rules(no_repeat_ngram_size=n).apply(scores, history, history, eos_id=EOS, pad_id=PAD)
    assert torch.equal(torch.isinf(ours), torch.isinf(hf)) and torch.isinf(ours).any()
    assert_close(ours[~torch.isinf(ours)], hf[~torch.isinf(hf)])


def test_min_length_equals_hugging_face_and_padding_never_counts():
    scores, history = scores_and_history()
    hf = transformers.MinNewTokensLengthLogitsProcessor(
        0, 15, EOS, device=str(scores.device))(history, scores.clone())
    ours = Rules(min_length=15).apply(scores, history, history, eos_id=EOS, pad_id=PAD)
    assert_close(ours, hf)
    assert torch.equal(Rules(min_length=12).apply(scores, history, history, eos_id=EOS,
                                                  pad_id=PAD), scores)
    padded = torch.full((1, 5), PAD)
    assert torch.equal(Rules(repetition_penalty=2.0, no_repeat_ngram_size=1).apply(
        scores[:1], padded, padded, eos_id=EOS, pad_id=PAD), scores[:1])


def test_presence_and_frequency_penalties_are_openais():
    scores = torch.zeros(1, 8)
    generated = torch.tensor([[5, 5, 5, 6]])
    ours = Rules(presence_penalty=0.5, frequency_penalty=0.25).apply(
        scores, generated, generated, eos_id=EOS, pad_id=PAD)
    expected = torch.zeros(1, 8)
    expected[0, 5] = -(0.5 + 3 * 0.25)
    expected[0, 6] = -(0.5 + 1 * 0.25)
    assert_close(ours, expected)


@pytest.mark.parametrize("rules", [
    Rules(repetition_penalty=1.3), Rules(no_repeat_ngram_size=2), Rules(min_length=11),
    Rules(presence_penalty=0.5, frequency_penalty=0.25),
    Rules(repetition_penalty=0.8, no_repeat_ngram_size=3, presence_penalty=0.2,
          min_length=13)])
def test_rules_given_only_what_they_read_score_as_given_everything(rules):
    """The engine builds only the histories the active rules read (reads_sequence,
    reads_generated) and gives min_length the rows' lengths; the scores must not change."""
    scores, history = scores_and_history(seed=3)
    history[:, -1] = history[:, 2]  # the last token came before: an n-gram to ban
    generated = history[:, 4:].clone()
    generated[1, 5:] = PAD  # a shorter row: its length counts only real tokens
    lengths = (generated != PAD).sum(1)
    full = rules.apply(scores, history, generated, eos_id=EOS, pad_id=PAD)
    assert not torch.equal(full, scores)  # the rules do something here
    lean = rules.apply(scores, history if rules.reads_sequence else None,
                       generated if rules.reads_generated else None, eos_id=EOS, pad_id=PAD,
                       lengths=lengths)
    assert torch.equal(lean, full)


def test_banned_ngrams_by_hand():
    assert banned_by_ngrams([1, 2, 3, 1, 2], 3) == {3}
    assert banned_by_ngrams([1, 2, 3, 4], 3) == set()
    assert banned_by_ngrams([7, 7], 2) == {7}


def tiny(arch, **kw):
    torch.manual_seed(0)
    return build_model(ModelConfig(arch=arch, vocab_size=12, d_model=16, n_heads=4, d_ff=32,
                                   n_layers=2, dropout=0.0, max_len=40, **kw)).eval()


def test_beam_search_with_no_repeat_never_repeats_an_ngram():
    m = tiny("encoder-decoder")
    g = torch.Generator(torch.get_default_device()).manual_seed(2)
    src = torch.randint(3, 12, (3, 8), generator=g)
    for hyps in beam_decode(m, src, beam=4, n_best=4, bos_id=BOS, eos_id=EOS, max_len_b=20,
                            rules=Rules(no_repeat_ngram_size=2)):
        for ids, _ in hyps:
            pairs = list(zip(ids, ids[1:], strict=False))
            assert len(pairs) == len(set(pairs)), ids
