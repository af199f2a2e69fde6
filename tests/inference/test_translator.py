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
    submit, decode = engine.submit, runner.decode

    def submit_spy(request):
        submitted.append(len(request.prompt))
        return submit(request)

    def decode_spy(plan_rows):
        steps.append(list(runner.cache.lengths[:runner.cache.sources_used]))
        return decode(plan_rows)

    engine.submit, runner.decode = submit_spy, decode_spy
    # 70 sources of 16 lengths, all like the copy task's (5-20 of a-j), which the model
    # copies exactly: a row's output is as long as its source, so short rows finish first
    texts = [("abcdefghij" * 3)[i % 7:i % 7 + 5 + i % 16] for i in range(70)]
    run.translate(texts, beam=1)
    assert submitted == sorted(submitted, reverse=True) and len(set(submitted)) > 3
    assert steps and all(step == sorted(step, reverse=True) for step in steps)


def test_an_offline_call_makes_an_engine_for_the_rows_it_decodes(copy_run):
    """An engine allocates and zeroes its cache when it is made, so a call makes one with
    room for its rows (a power of two, at most 512), a larger one when a call needs more,
    and keeps it for calls that need fewer; the translations are the full engine's."""
    run = vaswani.load(copy_run[0])
    size = lambda: run.engine_for(1).config.max_rows  # noqa: E731 (the engine held now)
    one = run.translate(["abcde"], beam=1)
    assert size() == 1
    assert run.translate(["abcde"], beam=2) == one and size() == 2
    many = run.translate(WORDS, beam=1)  # 70 rows
    assert size() == 128
    held = run.engine_for(1)
    assert run.translate(["abcde"], beam=4) == one and run.engine_for(1) is held
    full = vaswani.load(copy_run[0])
    assert full.engine.config.max_rows == 512
    assert full.translate(WORDS, beam=1) == many and full.translate(["abcde"]) == one
    assert full.engine.cache.rows > held.cache.rows
