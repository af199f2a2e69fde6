"""The decode step that a GPU captures as CUDA graphs (engine/graphs.py) pads rows to a
bucket of batch sizes and context widths; run eagerly here, it gives each row exactly the
logits of the unpadded step. (tests/cuda/ replays the captured graphs themselves.)"""

import torch
from torch.testing import assert_close

from tests.engine.test_engine import BOS, EOS, PAD, engine, model, prompts
from vaswani.engine import Params, Request
from vaswani.engine.graphs import StaticDecoder, batch_ladder, bucket


def test_the_ladder_of_batch_sizes():
    assert batch_ladder(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert batch_ladder(5) == [1, 2, 4, 5]
    assert bucket(3, batch_ladder(64)) == 4 and bucket(17, batch_ladder(64)) == 24


def running(m, sources=None):
    """An engine mid-way: every row prefilled, some decoded, all due for a decode step."""
    eng = engine(m, max_rows=16)
    if sources is None:
        requests = [Request(p, Params(max_new_tokens=20)) for p in prompts(7, seed=8)]
    else:
        requests = [Request(s + [EOS], Params(max_new_tokens=0), start=[BOS], history_start=1,
                            limit=20) for s in sources]
    for r in requests:
        eng.submit(r)
    for _ in range(4):
        eng.step()
    plan = eng.scheduler.plan()  # the next step's rows, with their blocks
    assert not plan.prefill and len(plan.decode) >= 4  # (a request may have ended)
    return eng, plan.decode


def test_padded_static_decode_equals_the_dynamic_step():
    for m, sources in [(model("decoder"), None),
                       (model("encoder-decoder"), prompts(5, seed=9, low=3))]:
        eng, rows = running(m, sources)
        static = StaticDecoder(m, eng.cache, pad_id=PAD, capture=False)
        want = eng.runner.forward([(r, s, 1) for r, s in rows])
        eng.runner.static = static
        logits, at = eng.runner.decode(rows)  # 7 (or 5) rows padded to a bucket of 8
        got = logits[at]
        assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert torch.equal(got.argmax(-1), want.argmax(-1))
