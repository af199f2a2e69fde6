"""experiments/step_floor.py: the written-out decoding step computes the model's logits, and
the benchmark times it beside the engine's step on a trained translator (timing is never
asserted)."""

import json
import sys

import pytest
import torch
from torch.testing import assert_close

from experiments import step_floor
from vaswani import ModelConfig, build_model
from vaswani.nn.kv_cache import KVCache


@pytest.mark.parametrize("norm_first,activation,positional", [
    (True, "relu", "sinusoidal"), (False, "gelu", "learned")])
def test_the_written_out_step_gives_the_models_next_token_logits(norm_first, activation,
                                                                 positional):
    """Three rows, five target tokens cached by the model's own incremental decoding: the
    written-out step's logits for the sixth are the model's."""
    cfg = ModelConfig(arch="encoder-decoder", vocab_size=37, d_model=32, n_heads=4, d_ff=64,
                      n_encoder_layers=2, n_decoder_layers=2, dropout=0.0, max_len=16,
                      norm_first=norm_first, activation=activation, positional=positional)
    model = build_model(cfg).eval()
    src, tgt = torch.randint(4, 37, (3, 7)), torch.randint(4, 37, (3, 6))
    with torch.no_grad():
        memory = model.encode(src)
        cache = KVCache(2)
        positions, mask = cache.inputs(tgt[:, :5])
        model.decode_step(tgt[:, :5], positions=positions, mask=mask, cache=cache,
                          memory=memory, memory_mask=None)

        def widened(t):  # column 5 is the step's to write (NaN: read before it is written)
            return torch.cat([t, torch.full((3, 4, 1, 8), float("nan"))], 2)

        keys = [widened(c.self_attn.k) for c in cache.layers]
        values = [widened(c.self_attn.v) for c in cache.layers]
        cross = [(c.cross_attn.k, c.cross_attn.v) for c in cache.layers]
        positions, mask = cache.inputs(tgt[:, 5:])
        expected = model.decode_step(tgt[:, 5:], positions=positions, mask=mask, cache=cache,
                                     memory_mask=None)[:, 0]
        got = step_floor.written_out(model)(tgt[:, 5], torch.full((3,), 5), 5, keys, values,
                                            [k for k, _ in cross], [v for _, v in cross])
    assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_models_it_does_not_cover_are_refused():
    cfg = ModelConfig(arch="encoder-decoder", vocab_size=37, d_model=32, n_heads=4, d_ff=64,
                      n_encoder_layers=1, n_decoder_layers=1, max_len=16, n_kv_heads=2)
    with pytest.raises(ValueError, match="multi-head attention"):
        step_floor.written_out(build_model(cfg))


@pytest.mark.slow
def test_the_benchmark_times_the_engine_the_written_out_and_the_compiled_step(
        copy_run, tmp_path, monkeypatch, capsys):
    """Two rows: the engine and the eager step timed here, the compiled step in a child
    process whose figures join the table (its tokens the eager step's)."""
    out = tmp_path / "floor.json"
    monkeypatch.setattr(sys, "argv", ["step_floor", str(copy_run[0]), "--rows", "2",
                                      "--repeats", "1", "--json", str(out)])
    step_floor.main()
    result = json.loads(out.read_text())
    row = result["rows"]["2"]
    assert result["steps"] >= 2 and row["compiled_same_tokens"] is True
    assert all(row[f"{name}_ms_per_step"] > 0 for name in ("engine", "written_out", "compiled"))
    assert row["compile_s"] > 0
    assert "| 2 | " in capsys.readouterr().out


def test_a_replay_prices_every_step_of_a_whole_translation(copy_run, tmp_path, monkeypatch,
                                                           capsys):
    """--replay: a translation of the run's first test sentences split into its encoder
    passes, its decoding steps and the rest, each step's shape priced written out; one row
    of a step gives one token, so the row-steps are the tokens the translations hold (each
    with its end token); the engine is left as it was."""
    import vaswani
    from benchmarks.common import test_pairs
    from vaswani.engine.runner import Runner

    decode, encode = Runner.decode, Runner.encode
    out = tmp_path / "replay.json"
    monkeypatch.setattr(sys, "argv", ["step_floor", str(copy_run[0]), "--replay", "12",
                                      "--repeats", "2", "--json", str(out)])
    step_floor.main()
    assert (Runner.decode, Runner.encode) == (decode, encode)
    r = json.loads(out.read_text())
    run = vaswani.load(copy_run[0])
    sources = [s for s, _ in test_pairs(run)][:12]
    cap = run.config.model.max_len - 1
    outputs = run.translate(sources, beam=1, length_penalty=0.0, max_len_a=0.0, max_len_b=cap)
    tokens = [len(run.target_tokenizer.encode(o)) for o in outputs]
    assert r["sentences"] == 12 and r["row_steps"] == sum(min(n + 1, cap) for n in tokens)
    assert r["steps"] == sum(row["steps"] for row in r["by_rows"].values())
    assert r["encode_s"] > 0 and r["decode_steps_s"] > 0 and r["written_out_steps_s"] > 0
    assert r["translate_at_floor_s"] >= r["encode_s"] + r["written_out_steps_s"]
    assert "| rows | steps | engine s | written out s |" in capsys.readouterr().out
