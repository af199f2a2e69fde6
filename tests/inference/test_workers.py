"""A translator's offline calls split across worker processes (inference/workers.py): every
text gets the translation the run alone gives it, in its place, with part of the work done
in another process; errors and a worker's end come back to the caller."""

import os
import platform
import sys

import pytest

import vaswani
from vaswani.cli import main
from vaswani.cli.process import MALLOC_SETTINGS
from vaswani.inference.workers import WorkerError, Workers, answer, deal

TEXTS = ["abcdefghij", "", "jihgfedcba", "aabbcc", "j", "abcabc", "hello", "cab", "bad",
         "dig", "e", "abcdefghijabcdefghij"] * 3


def test_texts_are_dealt_longest_first_to_each_worker_in_turn():
    assert deal([3, 9, 1, 9, 5], 2) == [[1, 4, 2], [3, 0]]
    assert deal([3, 9, 1, 9, 5], 3) == [[1, 0], [3, 2], [4]]
    assert deal([], 2) == [[], []]


@pytest.fixture(scope="module")
def split_run(copy_run):
    run = vaswani.load(copy_run[0], workers=2)
    yield run
    run.workers.close()


@pytest.mark.parametrize("beam,n_best", [(1, 1), (3, 2)])
def test_each_text_gets_its_own_translation_with_half_of_them_made_elsewhere(
        copy_run, split_run, monkeypatch, beam, n_best):
    alone = vaswani.load(copy_run[0]).translate(TEXTS, beam=beam, n_best=n_best)
    here = []
    own = split_run.own_translations

    def counted(texts, *args, **kwargs):  # this process's share (the worker's is its own)
        here.append(len(texts))
        return own(texts, *args, **kwargs)

    monkeypatch.setattr(split_run, "own_translations", counted)
    split = split_run.translate(TEXTS, beam=beam, n_best=n_best)
    if n_best == 1:
        assert split == alone
    else:  # the same hypotheses; their scores up to float32's rounding in passes of other
        # shapes (a share's sources are encoded in passes of their own lengths)
        assert [[t for t, _ in h] for h in split] == [[t for t, _ in h] for h in alone]
        assert [s for h in split for _, s in h] == pytest.approx(
            [s for h in alone for _, s in h], rel=1e-4)
    assert here == [len(TEXTS) // 2]  # the other half translated by the worker process


def test_a_worker_process_runs_under_a_commands_malloc_settings(copy_run, split_run,
                                                                monkeypatch):
    """A worker's process is vaswani's own (cli/worker.py): glibc's thresholds pinned, as a
    `vaswani` command pins its own, unless the user set malloc's variables (then they hold,
    and the worker says it left them)."""
    glibc = sys.platform == "linux" and platform.libc_ver()[0] == "glibc"
    set_by_hand = any(name in os.environ for name in MALLOC_SETTINGS)
    assert split_run.workers.malloc_pinned == [glibc and not set_by_hand]
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "1048576")
    workers = Workers(2, dict(run_dir=copy_run[0]), threads=2)
    try:
        assert workers.malloc_pinned == [False]
    finally:
        workers.close()


def test_fewer_texts_than_workers_leave_the_others_idle(copy_run):
    run, alone = vaswani.load(copy_run[0], workers=3), vaswani.load(copy_run[0])
    try:
        for texts in (["abc", "dcba"], ["hello"], TEXTS):  # shares of 1, 1 and 0; one text
            assert run.translate(texts) == alone.translate(texts)  # (this process alone)
    finally:
        run.workers.close()


def test_a_worker_that_ended_is_an_error_naming_it(copy_run):
    run = vaswani.load(copy_run[0], workers=2)
    run.workers._processes[0].kill()
    with pytest.raises(WorkerError, match=r"worker 1 ended \(exit code -9\)"):
        run.translate(TEXTS)
    run.workers.close()
    with pytest.raises(WorkerError, match="closed"):
        run.translate(TEXTS)


def test_a_worker_that_cannot_load_the_run_says_why(tmp_path):
    with pytest.raises(WorkerError, match=r"worker 1 could not load .*missing"):
        Workers(2, dict(run_dir=str(tmp_path / "missing")), threads=2)


def test_workers_are_for_a_translator_on_a_cpu(small_runs, copy_run):
    with pytest.raises(ValueError, match="workers split a translator's offline calls"):
        vaswani.load(small_runs["decoder"][0], workers=2)
    with pytest.raises(ValueError, match="whole number >= 1"):
        vaswani.load(copy_run[0], workers=0)
    with pytest.raises(ValueError, match="CTranslate2 runs its own"):
        vaswani.load(copy_run[0], engine="ct2", workers=2)


def test_the_translate_command_splits_its_lines_with_workers(copy_run, tmp_path, capsys):
    inputs = tmp_path / "in.txt"
    inputs.write_text("\n".join(TEXTS) + "\n")
    outputs = []
    for extra in ([], ["--workers", "2"]):
        assert main(["translate", str(copy_run[0]), "--input", str(inputs), "--beam", "2",
                     *extra]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1] and len(outputs[0].splitlines()) == len(TEXTS)
    with pytest.raises(SystemExit):
        main(["translate", str(copy_run[0]), "--workers", "0"])
    assert "whole number >= 1" in capsys.readouterr().err


def test_an_answer_that_cannot_be_sent_comes_as_an_error():
    """A result (or an exception) that cannot be pickled must not arrive as a result."""
    from multiprocessing import Pipe

    ours, theirs = Pipe()
    answer(theirs, "ok", lambda: 0)
    kind, value = ours.recv()
    assert kind == "error" and isinstance(value, RuntimeError)
    assert "ok answer could not be sent" in str(value) and "function" in str(value)
