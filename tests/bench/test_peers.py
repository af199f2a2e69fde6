"""benchmarks/peers.py: each engine runs in a child process of its own, as its users call it,
and gives vaswani's outputs; the children take turns; no torch in a peer's process (timing is
never asserted)."""

import os
import sys
import time

import pytest

import vaswani
from benchmarks import peers
from vaswani.cli.process import MALLOC_SETTINGS
from vaswani.export import export

pytest.importorskip("ctranslate2", reason="vaswani[export] is not installed")

WORDS = ["abcdefghij", "jihgfedcba", "aabbcc", "j", "abcabcabcabcabc", "hello", "cab"]


@pytest.fixture(scope="module")
def copy_ct2(copy_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("peers") / "copy-ct2"
    export(copy_run[0], "ct2", out)
    return copy_run[0], out


@pytest.mark.parametrize("beam", [1, 4])
def test_ctranslate2_child_translates_as_vaswani_does(copy_ct2, beam):
    """One translate_batch over every sentence (CTranslate2 sorts and batches), a character
    tokenizer's characters as tokens: the same translations as vaswani's, with one cap."""
    run_dir, folder = copy_ct2
    run = vaswani.load(run_dir)
    cap = run.config.model.max_len - 1
    ours = run.translate(WORDS, beam=beam, length_penalty=0.0, max_len_a=0.0, max_len_b=cap)
    result = peers.run_child({"engine": "ctranslate2", "task": "translate",
                              "model": str(folder), "inputs": WORDS, "threads": 1,
                              "options": {"beam_size": beam, "length_penalty": 0.0,
                                          "max_decoding_length": cap}})
    assert result["outputs"] == ours
    assert result["seconds"] > 0
    assert result["settings"]["batch_type"] == "tokens"  # its own batching, by tokens


def test_ctranslate2_child_continues_prompts_as_vaswani_does(small_runs, tmp_path):
    """A byte-level BPE language model: the tokenizers library's tokens in, greedy
    continuations out, as vaswani's generate_many."""
    run_dir, _ = small_runs["decoder"]
    export(run_dir, "ct2", tmp_path / "lm")
    prompts = ["to be or not", "question", "that is the"]
    ours = vaswani.load(run_dir).generate_many(prompts, max_new_tokens=12, temperature=0)
    result = peers.run_child({"engine": "ctranslate2", "task": "generate",
                              "model": str(tmp_path / "lm"), "inputs": prompts, "threads": 1,
                              "options": {"max_length": 12}})
    assert result["outputs"] == ours


def test_race_alternates_the_children_and_keeps_each_ones_best(copy_ct2):
    run_dir, folder = copy_ct2
    common = {"task": "translate", "inputs": WORDS[:3], "threads": 1}
    raced = peers.race({
        "vaswani": {**common, "engine": "vaswani", "model": str(run_dir),
                    "options": {"beam": 1, "max_len_a": 0.0, "max_len_b": 31}},
        "ctranslate2": {**common, "engine": "ctranslate2", "model": str(folder),
                        "options": {"beam_size": 1, "max_decoding_length": 31}}}, rounds=2)
    a, b = raced["vaswani"]["started"], raced["ctranslate2"]["started"]
    assert a[0] < b[0] < a[1] < b[1]  # a, b, a, b: the machine's load hits both alike
    for r in raced.values():
        assert r["seconds"] == min(r["rounds"]) and len(r["rounds"]) == 2
        assert r["per_s"] == round(3 / r["seconds"], 1)
    assert peers.agreement(raced["vaswani"]["outputs"], raced["ctranslate2"]["outputs"]) == 1
    # vaswani's child runs under the malloc settings of a `vaswani` command, as its CLI does
    assert raced["vaswani"]["settings"]["malloc_pinned"] is not any(
        name in os.environ for name in MALLOC_SETTINGS)


def test_a_peer_child_refuses_to_time_with_torch_loaded(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", sys.modules.get("torch", object()))
    with pytest.raises(RuntimeError, match="torch was imported in the ctranslate2 child"):
        peers._no_torch("ctranslate2")


def test_a_failing_child_says_which_engine_and_why(tmp_path):
    with pytest.raises(RuntimeError, match="the ctranslate2 child failed"):
        peers.run_child({"engine": "ctranslate2", "task": "translate",
                         "model": str(tmp_path / "missing"), "inputs": ["a"], "threads": 1,
                         "options": {}})


def test_agreement_is_the_share_of_equal_outputs():
    assert peers.agreement(["a", "b", "c", "d"], ["a", "x", "c", "d"]) == 0.75


def test_ctranslate2_is_raced_at_each_batch_setting_and_keeps_its_fastest(copy_ct2):
    """Each CTranslate2 row is CTranslate2 at its best of several batch settings and both CPU
    backends: the child takes the setting and the backend's environment given (its outputs
    the same on both), and keep_fastest folds the group into its fastest entry."""
    run_dir, folder = copy_ct2
    job = {"engine": "ctranslate2", "task": "translate", "model": str(folder),
           "inputs": WORDS, "threads": 1, "options": {"beam_size": 1, "max_decoding_length": 31}}
    jobs = peers.batchings("ctranslate2", job)
    assert len(jobs) == len(peers.CT2_BATCHINGS) * len(peers.CT2_BACKENDS) >= 4
    ours = vaswani.load(run_dir).translate(WORDS, beam=1, max_len_a=0.0, max_len_b=31)
    for backend, env in peers.CT2_BACKENDS.items():
        label = f"ctranslate2 [64 examples, {backend}]"
        result = peers.run_child(jobs[label])
        assert result["settings"]["batch_type"] == "examples"
        assert result["settings"]["backend"] == backend
        assert result["settings"]["CT2_USE_MKL"] == env["CT2_USE_MKL"]
        assert result["outputs"] == ours

    # on more than one core, also a worker per core, batches side by side (inter_threads)
    two = peers.batchings("ctranslate2", {**job, "threads": 2, "inputs": WORDS * 8})
    assert len(two) == 2 * len(jobs)
    result = peers.run_child(two["ctranslate2 [64 examples, oneDNN, 2 workers]"])
    assert (result["settings"]["inter_threads"], result["settings"]["intra_threads"]) == (2, 1)
    assert result["outputs"] == ours * 8

    raced = {"vaswani": {"seconds": 2.0, "per_s": 3.5},
             "ct2 [1024 tokens]": {"seconds": 3.0, "per_s": 2.3, "settings": "a"},
             "ct2 [64 examples]": {"seconds": 1.0, "per_s": 7.0, "settings": "b"},
             "ct2 [4096 tokens]": {"seconds": 4.0, "per_s": 1.8, "settings": "c"}}
    kept = peers.keep_fastest(raced)
    assert set(kept) == {"vaswani", "ct2"}
    assert kept["ct2"]["settings"] == "b" and kept["ct2"]["seconds"] == 1.0
    assert kept["ct2"]["tried"] == {"1024 tokens": 2.3, "64 examples": 7.0, "4096 tokens": 1.8}
    assert kept["vaswani"] == raced["vaswani"]


def test_vaswani_is_raced_in_one_process_and_split_across_a_process_per_core(copy_run):
    """As CTranslate2 with a worker per core: vaswani's translation rows also run split
    across a process per core (``vaswani.load(..., workers=N)``), the translations the same."""
    job = {"engine": "vaswani", "task": "translate", "model": str(copy_run[0]),
           "inputs": WORDS * 8, "threads": 2,
           "options": {"beam": 2, "max_len_a": 0.0, "max_len_b": 31}}
    jobs = peers.vaswani_workers("vaswani", job)
    assert list(jobs) == ["vaswani [1 worker]", "vaswani [2 workers]"]
    assert list(peers.vaswani_workers("vaswani", {**job, "threads": 1})) == ["vaswani [1 worker]"]
    result = peers.run_child(jobs["vaswani [2 workers]"])
    assert result["settings"]["workers"] == 2 and result["settings"]["threads"] == 2
    assert result["outputs"] == vaswani.load(copy_run[0]).translate(
        WORDS * 8, beam=2, max_len_a=0.0, max_len_b=31)


def test_race_at_best_picks_a_setting_then_times_every_engine_as_often(monkeypatch):
    """A group of settings runs once each, its fastest is kept, then it and the single jobs
    alternate for as many rounds each: no contender's best is a best of more tries."""
    seconds = {"v": 2.0, "ct2 [a]": 3.0, "ct2 [b]": 1.0, "ct2 [c]": 4.0}
    calls = []

    def child(job):
        calls.append(job["key"])
        return {"outputs": ["x"], "seconds": seconds[job["key"]] + 0.1 * len(calls),
                "settings": {"key": job["key"]}, "started": len(calls)}

    monkeypatch.setattr(peers, "run_child", child)
    raced = peers.race_at_best({key: {"key": key} for key in seconds}, rounds=3)
    assert calls == ["ct2 [a]", "ct2 [b]", "ct2 [c]", *["v", "ct2 [b]"] * 3]
    assert set(raced) == {"v", "ct2"}
    assert len(raced["v"]["rounds"]) == len(raced["ct2"]["rounds"]) == 3
    assert raced["ct2"]["setting"] == "b" and raced["ct2"]["settings"] == {"key": "ct2 [b]"}
    assert raced["ct2"]["seconds"] == min(raced["ct2"]["rounds"]) == 1.0 + 0.1 * 5
    assert raced["ct2"]["tried"] == {"a": round(1 / 3.1, 1), "b": round(1 / 1.2, 1),
                                     "c": round(1 / 4.3, 1)}


def test_short_passes_repeat_and_the_best_is_kept(monkeypatch):
    """A pass shorter than the timed budget repeats (up to MAX_PASSES); the best is kept."""
    calls, slow = [], iter([0.06, 0.01, 0.04, 0.04, 0.04])

    def fn(inputs):
        calls.append(len(inputs))
        if len(calls) > 1:  # the warm-up is not timed
            time.sleep(next(slow))
        return [x.upper() for x in inputs]

    monkeypatch.setattr(peers, "TIMED_SECONDS", 0.1)
    out, best = peers._timed(fn, ["a"] * 20)
    assert out == ["A"] * 20
    assert calls == [peers.WARMUP, 20, 20, 20]  # 0.06 + 0.01 + 0.04 >= 0.1: three passes
    assert 0.01 <= best < 0.04
    monkeypatch.setattr(peers, "TIMED_SECONDS", 100.0)
    calls.clear()
    slow = iter([0.0] * 10)
    peers._timed(fn, ["a"] * 20)
    assert len(calls) == 1 + peers.MAX_PASSES
