"""``--fast-prefill`` / ``vaswani.load(..., fast_prefill=...)``: an int8 language model's
engines prefill with bfloat16 products (cpu/quantized.py ``widened``), by default where the
CPU has them; asked for anything else, refused by name."""

import re

import pytest

from vaswani.cpu import quantized

pytestmark = pytest.mark.usefixtures("on_cpu")  # int8 is a CPU path


def test_load_fast_prefill_gives_engines_that_widen_their_prefills(small_runs, monkeypatch):
    import vaswani
    from vaswani.engine import EngineConfig

    monkeypatch.setattr(quantized, "bf16_products", lambda: True)
    run_dir = small_runs["decoder"][0]
    fast = vaswani.load(run_dir, quantize="int8", fast_prefill=True, compiled=False)
    plain = vaswani.load(run_dir, quantize="int8", fast_prefill=False, compiled=False)
    assert fast.new_engine(EngineConfig()).config.bf16_prefill
    assert not plain.new_engine(EngineConfig()).config.bf16_prefill
    calls = []
    real = quantized.widened_product
    monkeypatch.setattr(quantized, "widened_product", lambda *a: calls.append(1) or real(*a))
    long = "to be or not to be, that is the question " * 3  # past WIDEN_FROM tokens
    text = fast.generate(long, max_new_tokens=8, temperature=0)
    assert calls and isinstance(text, str)
    calls.clear()
    fast.generate("to be", max_new_tokens=8, temperature=0)  # too short to widen
    plain.generate(long, max_new_tokens=8, temperature=0)
    assert not calls


def test_fast_prefill_is_the_default_where_the_cpu_has_bfloat16_products(small_runs,
                                                                          monkeypatch):
    import vaswani
    from vaswani.engine import EngineConfig
    from vaswani.inference import base

    lm, encoder = small_runs["decoder"][0], small_runs["encoder"][0]
    for has in (True, False):
        monkeypatch.setattr(base, "bf16_products", lambda has=has: has)
        assert vaswani.load(lm, quantize="int8", compiled=False).fast_prefill is has
    monkeypatch.setattr(base, "bf16_products", lambda: True)
    for run in (vaswani.load(lm, quantize="int8", fast_prefill=False, compiled=False),
                vaswani.load(lm, quantize="int4", compiled=False), vaswani.load(lm),
                vaswani.load(encoder, quantize="int8")):
        assert not run.fast_prefill  # asked not to, or nothing to widen: no refusal
    run = vaswani.load(lm, quantize="int8", compiled=False)
    assert run.new_engine(EngineConfig()).config.bf16_prefill
    assert not run.new_engine(EngineConfig(), fast_prefill=False).config.bf16_prefill


def test_fast_prefill_is_refused_without_int8_and_for_a_classifier(small_runs):
    import vaswani

    with pytest.raises(ValueError, match=re.escape("--fast-prefill is for a language model's "
                                                   "int8 weights (--quantize int8)")):
        vaswani.load(small_runs["decoder"][0], fast_prefill=True)
    with pytest.raises(ValueError, match="--quantize int4"):
        vaswani.load(small_runs["decoder"][0], quantize="int4", fast_prefill=True)
    with pytest.raises(ValueError, match="--fast-prefill"):
        vaswani.load(small_runs["encoder"][0], quantize="int8", fast_prefill=True)


def test_fast_prefill_on_a_cpu_without_bfloat16_products_warns_and_keeps_the_kernel(
        small_runs, monkeypatch):
    import vaswani
    from vaswani.inference import base

    for module in (quantized, base):  # the check at loading, and the layers'
        monkeypatch.setattr(module, "bf16_products", lambda: False)
    with pytest.warns(UserWarning, match="no bfloat16 matrix products"):
        run = vaswani.load(small_runs["decoder"][0], quantize="int8", fast_prefill=True,
                           compiled=False)
    calls = []
    monkeypatch.setattr(quantized, "widened_product", lambda *a: calls.append(1))
    run.generate("to be or not to be", max_new_tokens=4, temperature=0)
    assert not calls


def test_generate_fast_prefill_from_the_command_line(small_runs, capsys, monkeypatch):
    import vaswani.inference
    from vaswani.cli import main

    asked = []
    load = vaswani.inference.load
    monkeypatch.setattr(vaswani.inference, "load", lambda *a, **kw: asked.append(
        kw["fast_prefill"]) or load(*a, **kw))

    run = str(small_runs["decoder"][0])
    prompt = ["--prompt", "to be or not to be", "--temperature", "0", "--max-new-tokens", "8"]
    assert main(["generate", run, *prompt, "--quantize", "int8", "--fast-prefill",
                 "--eager"]) == 0
    assert capsys.readouterr().out.strip()
    assert main(["generate", run, *prompt, "--fast-prefill"]) != 0
    assert "--fast-prefill is for a language model's int8 weights" in capsys.readouterr().err
    assert main(["generate", run, *prompt, "--quantize", "int8", "--no-fast-prefill",
                 "--eager"]) == 0
    assert main(["generate", run, *prompt, "--quantize", "int8", "--eager"]) == 0
    assert asked == [True, True, False, None]  # None: load decides (the default)
