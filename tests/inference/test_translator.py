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
