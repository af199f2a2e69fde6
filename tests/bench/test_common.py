"""benchmarks/common.py: a result file says what it was measured on, down to the vector
instructions PyTorch's kernels use (the CPU machines differ between sessions)."""

import json

import torch

from benchmarks.common import report


def test_a_result_file_names_the_cpu_and_the_kernels_instruction_set(tmp_path):
    out = tmp_path / "r.json"
    report("t", [("a", "1")], {"a": 1}, str(out))
    written = json.loads(out.read_text())
    assert written["a"] == 1
    hw = written["hardware"]
    assert hw["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert hw["cpu"] and hw["cores"] >= 1 and hw["threads"] == torch.get_num_threads()
    # which generation and vector units: one model name ("AMD EPYC") covers CPUs 2x apart
    assert "cpu_generation" in hw and isinstance(hw["cpu_simd"], list)


def test_a_step_timing_takes_the_first_40_to_80_token_reference_else_the_longest():
    from benchmarks.common import step_sentence

    class Words:  # a tokenizer of one token per word
        def encode(self, text):
            return text.split()

    pairs = [("short", "a " * 10), ("first", "b " * 50), ("second", "c " * 60),
             ("long", "d " * 90)]
    assert step_sentence(pairs, Words()) == "first"
    assert step_sentence([pairs[0], pairs[3]], Words()) == "long"  # none 40-80: the longest


def test_near_tie_names_eager_decodings_two_best_tokens_where_another_parts(small_runs):
    """Where another engine's greedy tokens first part from eager's, ``near_tie`` reports
    eager's token, the other's, and eager's two best there (so a tie can be told from an
    error); equal tokens give None."""
    import vaswani
    from benchmarks.common import first_difference, near_tie

    lm, _ = small_runs["decoder"]
    prompt = [5, 6, 7, 8]
    run = vaswani.load(lm)
    eager = []  # greedy decoding, one token at a time: the best at the place after the last
    for _ in range(6):
        _, top = run.token_logprobs(prompt + eager + [0], top=1)[-1]
        eager.append(top[0][0])
    _, top = run.token_logprobs(prompt + eager[:4], top=2)[-1]
    other = eager[:3] + [top[1][0]] + eager[4:]
    got = near_tie(lm, "fp32", prompt, eager, other, label="other")
    assert first_difference(eager, other) == 3 and got["index"] == 3
    assert got["eager"] == eager[3] == got["eager_top_2"][0][0]
    assert got["other"] == other[3] == got["eager_top_2"][1][0]
    assert got["logprobs"] == {"eager": got["eager_top_2"][0][1],
                               "other": got["eager_top_2"][1][1]}
    assert near_tie(lm, "fp32", prompt, eager, list(eager)) is None
    _, top = run.token_logprobs(prompt + eager[:4], top=3)[-1]  # the third best, outside
    third = near_tie(lm, "fp32", prompt, eager, eager[:3] + [top[2][0]], label="other")
    assert third["other"] not in [t for t, _ in third["eager_top_2"]]
    assert third["logprobs"]["other"] == round(top[2][1], 4)


def test_a_peer_venv_asked_for_twice_at_once_is_made_once(tmp_path, monkeypatch):
    """Two processes (test workers, benchmarks) asking for one peer venv at once: the second
    waits for the first's lock, then takes the venv the first made instead of clearing it
    and installing again. The test plays the first: it holds the lock, finishes the venv
    (its python and the marker of what it holds) and lets go."""
    import subprocess
    import threading

    from benchmarks import common
    from vaswani import atomic

    monkeypatch.setenv("VASWANI_CACHE", str(tmp_path))
    root = tmp_path / "venvs" / "peer"
    ran, waiting, real = [], threading.Event(), atomic.one_at_a_time
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: ran.append(a))
    monkeypatch.setattr(atomic, "one_at_a_time", lambda p: waiting.set() or real(p))
    got = []
    with real(root):
        second = threading.Thread(target=lambda: got.append(common.peer_venv("peer", ["x==1"])))
        second.start()
        assert waiting.wait(60)  # the second is at the lock
        (root / "bin").mkdir(parents=True)
        (root / "bin" / "python").write_text("")
        (root / ".complete").write_text("x==1\n")
    second.join(60)
    assert ran == [] and got == [root / "bin" / "python"]


def test_a_ratio_keeps_three_significant_figures_however_small():
    """The CI failure it fixes: 0.008 ms against a 2.128 ms hiccup read 0.0 at two decimals."""
    from benchmarks.common import ratio

    assert ratio(0.008, 2.128) == 0.00376
    assert ratio(2.128, 0.008) == 266.0
    assert ratio(1.0, 3.0) == 0.333
