"""The scheduler's fast lane (engine/scheduler.py): a short request among longer ones is
decoded at every step and the long ones at every other step while it runs, on a CPU by
default; what each request decodes does not change."""

import random

import torch

from tests.conftest import DEVICE
from tests.engine.test_engine import alone, engine, model, prompts
from vaswani.engine import EngineConfig, Params, Request, Status
from vaswani.engine.config import FAST_LANE, fast_lane_for
from vaswani.generation import Rules


def steps_of(lane: int) -> tuple[list[list[int]], list[int], list[list[int]]]:
    """Five requests of 30 tokens running, then one of 4: each step's new tokens of the long
    ones and of the short one while it runs, then of the long ones for two more steps."""
    e = engine(model("decoder", max_len=80), max_rows=8, fast_lane=lane)
    longs = [e.submit(Request(p, Params(max_new_tokens=30, rules=Rules(min_length=30))))
             for p in prompts(5, seed=2)]
    while any(r.generated == 0 for r in longs):
        e.step()
    short = e.submit(Request([5, 6, 7], Params(max_new_tokens=4, rules=Rules(min_length=4))))

    def step() -> tuple[list[int], int]:
        before, mine = [r.generated for r in longs], short.generated
        e.step()
        return [r.generated - b for r, b in zip(longs, before, strict=True)], \
            short.generated - mine

    during = []
    while short.status is not Status.FINISHED:
        during.append(step())
    after = [step()[0] for _ in range(2)]
    return [d[0] for d in during], [d[1] for d in during], after


def test_the_fast_lane_decodes_a_short_request_every_step_and_long_ones_every_other():
    longs, short, after = steps_of(lane=4)
    assert short == [1, 1, 1, 1]  # its prefill gives the first
    assert longs == [[1] * 5, [0] * 5, [1] * 5, [0] * 5]  # a step of the short one alone
    assert after == [[1] * 5, [1] * 5]  # it has gone: every row, every step again
    longs, short, after = steps_of(lane=0)  # no lane: every row, every step
    assert short == [1, 1, 1, 1] and longs == [[1] * 5] * 4 and after == [[1] * 5] * 2
    longs, short, _ = steps_of(lane=40)  # every request is in the lane: no lane
    assert longs == [[1] * 5] * 4


def test_the_fast_lane_changes_no_request_s_tokens():
    lm = model("decoder")
    rng = random.Random(3)
    cases = []
    for i, p in enumerate(prompts(16, seed=4)):
        limit = rng.choice([2, 3, 5]) if i % 3 == 0 else rng.randint(12, 20)
        sampled = dict(temperature=0.9, top_k=5, seed=i) if i % 2 else {}
        cases.append((p, Params(max_new_tokens=limit, rules=Rules(min_length=limit),
                                **sampled)))
    e = engine(lm, max_rows=16, fast_lane=5)
    requests = [e.submit(Request(p, params)) for p, params in cases[:10]]
    for _ in range(3):  # the rest arrive while the first run
        e.step()
    requests += [e.submit(Request(p, params)) for p, params in cases[10:]]
    while e.busy:
        e.step()
    for (p, params), r in zip(cases, requests, strict=True):
        assert r.output == alone(lm, p, params), (p, params)


def test_the_lane_is_a_cpu_s_by_default_and_off_offline(small_runs):
    from vaswani.inference import load

    assert fast_lane_for(torch.device("cpu")) == FAST_LANE
    assert fast_lane_for(torch.device("cuda")) == 0  # a step of 32 rows costs one of 1
    lane = engine(model("decoder")).scheduler.fast_lane
    assert lane == (FAST_LANE if DEVICE.type == "cpu" else 0)
    assert EngineConfig().fast_lane is None
    assert engine(model("decoder"), fast_lane=0).scheduler.fast_lane == 0
    run = load(small_runs["decoder"][0], device=str(DEVICE))  # offline: every request's
    # tokens count alike
    assert run.engine.scheduler.fast_lane == 0
    assert run.new_engine(EngineConfig()).scheduler.fast_lane == lane  # as a server's
