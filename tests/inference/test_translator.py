"""Translator.translate's batching: by default as many sentences run together as the engine's
rows hold; ``batch_size`` caps them; the translations are the same either way."""

import pytest

import vaswani

WORDS = ["abcdefghij", "jihgfedcba", "aabbcc", "j", "abcabc", "hello", "cab", "bad", "dig", "e"] * 7


@pytest.mark.parametrize("beam", [1, 2])
def test_translate_fills_the_engines_rows_unless_batch_size_caps_them(copy_run, beam):
    run = vaswani.load(copy_run[0])
    runner = run.engine.runner
    decode, rows = runner.decode, []

    def counting(plan_rows):
        rows.append(runner.cache.used)  # the slots a decode step runs over
        return decode(plan_rows)

    runner.decode = counting
    together = run.translate(WORDS, beam=beam)
    assert max(rows) == len(WORDS) * beam  # all 70 at once (512 rows fit), not 64 of them
    rows.clear()
    assert run.translate(WORDS, beam=beam, batch_size=2) == together
    assert max(rows) == 2 * beam


def test_sources_go_in_longest_first_and_the_slots_stay_in_length_order(copy_run):
    """The engine gets the requests longest source first, so that the rows finishing first
    (short sources) hold the last slots and compaction leaves the source slots in length
    order: every decode step's source lengths, slot by slot, never rise."""
    run = vaswani.load(copy_run[0])
    engine, runner = run.engine, run.engine.runner
    submitted, steps = [], []
    engine_run, decode = engine.run, runner.decode

    def run_spy(requests, *args, **kwargs):
        submitted.append([len(r.prompt) for r in requests])
        return engine_run(requests, *args, **kwargs)

    def decode_spy(plan_rows):
        steps.append(list(runner.cache.lengths[:runner.cache.sources_used]))
        return decode(plan_rows)

    engine.run, runner.decode = run_spy, decode_spy
    # 70 sources of 16 lengths, all like the copy task's (5-20 of a-j), which the model
    # copies exactly: a row's output is as long as its source, so short rows finish first
    texts = [("abcdefghij" * 3)[i % 7:i % 7 + 5 + i % 16] for i in range(70)]
    run.translate(texts, beam=1)
    [lengths] = submitted
    assert lengths == sorted(lengths, reverse=True) and len(set(lengths)) > 3
    assert steps and all(step == sorted(step, reverse=True) for step in steps)
