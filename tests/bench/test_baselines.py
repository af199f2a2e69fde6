"""The benchmark's comparison models must be what they claim: the same function as vaswani
where they should be (torch.nn.Transformer) and trainable (the tutorial version). Timing is
never asserted."""

import torch

from benchmarks import train_step
from benchmarks.baselines import NaiveLayerNorm, NaiveTransformer, TorchTransformer


def test_torch_baseline_computes_what_vaswani_computes(monkeypatch):
    """Same weights -> same logits: the benchmark compares equal work."""
    for name, value in dict(D=32, HEADS=4, D_FF=64, LAYERS=2, VOCAB=50, DROPOUT=0.0).items():
        monkeypatch.setattr(train_step, name, value)
    torch.manual_seed(0)
    ours = train_step.vaswani_model().double().eval()
    theirs = TorchTransformer(50, 32, 4, 64, 2, 0.0).double().eval()
    t = theirs.transformer
    with torch.no_grad():
        theirs.embed.token.weight.copy_(ours.src_embed.token.weight)
        for side, stack in (("encoder", ours.encoder), ("decoder", ours.decoder)):
            tl = getattr(t, side)
            for mine, ref in zip(stack.layers, tl.layers, strict=True):
                ref.self_attn.in_proj_weight.copy_(mine.self_attn.in_proj.weight)
                ref.self_attn.in_proj_bias.copy_(mine.self_attn.in_proj.bias)
                ref.self_attn.out_proj.load_state_dict(mine.self_attn.out_proj.state_dict())
                ref.linear1.load_state_dict(mine.feed_forward.linear1.state_dict())
                ref.linear2.load_state_dict(mine.feed_forward.linear2.state_dict())
                blocks = [mine.attn_block, mine.ff_block] if side == "encoder" else \
                    [mine.self_block, mine.cross_block, mine.ff_block]
                for i, block in enumerate(blocks, start=1):
                    getattr(ref, f"norm{i}").load_state_dict(block.norm.state_dict())
                if side == "decoder":
                    ref.multihead_attn.in_proj_weight.copy_(mine.cross_attn.in_proj.weight)
                    ref.multihead_attn.in_proj_bias.copy_(mine.cross_attn.in_proj.bias)
                    ref.multihead_attn.out_proj.load_state_dict(
                        mine.cross_attn.out_proj.state_dict())
            tl.norm.load_state_dict(stack.norm.state_dict())
    src = torch.randint(4, 50, (2, 7))
    tgt = torch.randint(4, 50, (2, 5))
    src[1, 5:] = 0
    torch.testing.assert_close(ours(src, tgt), theirs(src, tgt))


def test_naive_baseline_trains_and_has_the_tutorial_layernorm():
    torch.manual_seed(0)
    model = NaiveTransformer(30, 16, 2, 32, 1, 0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    src = torch.randint(4, 30, (4, 6))
    tgt = torch.cat([torch.ones(4, 1, dtype=torch.long), src], 1)
    losses = []
    for _ in range(30):
        loss = train_step.loss_of(model, src, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(float(loss))
    assert losses[-1] < 0.5 * losses[0]
    x = torch.randn(3, 8, dtype=torch.float64)
    ln = NaiveLayerNorm(8).double()
    unbiased = (x - x.mean(-1, keepdim=True)) / (x.std(-1, keepdim=True) + 1e-6)
    torch.testing.assert_close(ln(x), unbiased)
    assert not torch.allclose(ln(x), torch.nn.functional.layer_norm(x, (8,)))


def test_a_step_profile_splits_the_time_into_kinds_that_add_up(monkeypatch):
    """``--profile``: the shares of a (tiny) fp32 step: matrix products take some, they and
    the other kinds add up to the whole, and the products' own speed is set against the
    peak."""
    for name, value in dict(D=32, HEADS=2, D_FF=64, LAYERS=1, VOCAB=50, BATCH=2, SRC_LEN=6,
                            TGT_LEN=6).items():
        monkeypatch.setattr(train_step, name, value)
    monkeypatch.setattr(train_step, "matmul_peak_gflops", lambda dtype: 1000.0)
    found = train_step.profile_step("fp32", steps=1)
    shares = found["shares"]
    assert set(shares) == {*train_step.KINDS, "the rest"}
    assert shares["matrix products"] > 0 and abs(sum(shares.values()) - 1.0) < 1e-9
    assert found["peak_gflops"] == 1000.0 and found["matmul_gflops"] > 0
    others = found["largest_others"]
    assert 0 < len(others) <= 8 and not set(others) & set(train_step.KINDS["matrix products"])
    assert list(others.values()) == sorted(others.values(), reverse=True)


def test_the_implementations_take_turns_in_blocks_on_the_same_batches():
    """time_steps: warm-up steps for each, then rounds in which each step function takes a
    block of the same batches (its first step untimed: it follows another model's), so a
    change in the machine's load falls on all; each one's median of its timed steps."""
    import time

    calls = []

    def step(name, seconds):
        def run(src, tgt):
            calls.append((name, src))
            time.sleep(seconds if src not in (2, 5) else 0.2)  # the untimed steps: slow
        return run

    data = [(i, None) for i in range(8)]
    medians = train_step.time_steps({"a": step("a", 0.0), "b": step("b", 0.02)}, data,
                                    warmup=2, rounds=2, per_round=2)
    assert calls == [("a", 0), ("a", 1), ("b", 0), ("b", 1),
                     ("a", 2), ("a", 3), ("a", 4), ("b", 2), ("b", 3), ("b", 4),
                     ("a", 5), ("a", 6), ("a", 7), ("b", 5), ("b", 6), ("b", 7)]
    assert set(medians) == {"a", "b"} and medians["a"] < 0.01 <= medians["b"] < 0.1


def test_the_compiled_contender_is_vaswanis_model_under_torch_compile(monkeypatch):
    """``--only ... compiled``: vaswani's model and optimizer, its forward passed through
    ``torch.compile`` (as ``[train] compile = true``); the same loss as the eager step.
    (torch.compile itself is stood in for: compiling takes a minute on 2 cores.)"""
    for name, value in dict(D=32, HEADS=2, D_FF=64, LAYERS=1, VOCAB=50, BATCH=2, SRC_LEN=6,
                            TGT_LEN=6).items():
        monkeypatch.setattr(train_step, name, value)
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(model) or model)
    src, tgt = train_step.batches(1)[0]
    eager = train_step.make_step("vaswani", bf16=False)(src, tgt)
    assert not compiled
    loss = train_step.make_step("compiled", bf16=False)(src, tgt)
    assert len(compiled) == 1 and type(compiled[0]).__name__ == "EncoderDecoder"
    assert loss == eager
    assert "compiled" not in train_step.DEFAULT
