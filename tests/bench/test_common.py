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
