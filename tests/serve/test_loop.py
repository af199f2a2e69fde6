"""The server's engine loop (serve/loop.py): one thread steps every engine in turn, a step
that fails fails only the request that fails alone, and what a step's hooks post reaches its
asyncio event loop in one call per step, in order."""

from tests.engine.test_engine import alone, engine, model
from vaswani.engine import Params, Request
from vaswani.generation import Rules
from vaswani.serve.loop import EngineLoop


def test_a_step_that_fails_fails_only_the_request_that_fails_alone(monkeypatch):
    """The loop retries every request of a failed step alone: only the poisoned one gets
    the error; the others finish as they would have."""
    lm = model("decoder")
    eng = engine(lm, max_rows=8)
    forward = eng.runner.forward

    def poisoned(rows):
        if any(13 in seq.tokens[:4] for _, seq, _ in rows):
            raise RuntimeError("a poisoned row")
        return forward(rows)

    monkeypatch.setattr(eng.runner, "forward", poisoned)
    loop = EngineLoop({"test": eng})
    cases = [(p, Params(max_new_tokens=8)) for p in ([5, 6], [13, 7], [8, 9, 10])]
    done = []
    requests = [Request(p, params, on_finish=done.append) for p, params in cases]
    try:
        for r in requests:
            loop.submit("test", [r])
        loop.call(lambda: None).result(timeout=60)
        for _ in range(600):
            if len(done) == 3:
                break
            loop.call(lambda: None).result(timeout=60)
    finally:
        loop.stop()
    good, bad, other = requests
    assert bad.reason == "error" and "poisoned" in str(bad.error)
    for (p, params), r in ((cases[0], good), (cases[2], other)):
        assert r.error is None and r.output == alone(lm, p, params)


def test_one_loop_steps_every_engine_and_a_request_joins_the_next_step_of_its_own():
    """Two engines in one loop step in turn; a request that arrives while one of them steps
    is taken before the other's next step, not a whole round later."""
    first, second = engine(model("decoder"), max_rows=4), engine(model("decoder"), max_rows=4)
    order = []
    late = Request([7, 8], Params(max_new_tokens=3))
    for name, eng in (("first", first), ("second", second)):
        def step(eng=eng, name=name, step=eng.step):
            if name == "first" and not order:  # arrives while the first engine steps
                loop.submit("second", [late])
            order.append(name)
            return step()
        eng.step = step
    loop = EngineLoop({"first": first, "second": second})
    try:
        early = Request([5, 6], Params(max_new_tokens=3))
        loop.submit("first", [early])
        for _ in range(600):
            if early.finished and late.finished:
                break
            loop.call(lambda: None).result(timeout=60)
    finally:
        loop.stop()
    assert order[:2] == ["first", "second"], order  # the same round
    assert late.output == alone(second.model, [7, 8], late.params)
    assert early.output == alone(first.model, [5, 6], early.params)


def test_what_a_steps_hooks_post_reaches_its_event_loop_in_one_call_per_step_in_order():
    """A server streams each token through its asyncio event loop; the loop's thread hands
    a step's tokens over in one call (one wake-up of the server's thread per step, not per
    token), in the order they were posted, as soon as the step ends (not when more work
    arrives); a post ``now`` (a stream's first) goes at once, with those before it; a post
    from another thread goes at once."""
    import asyncio
    import threading

    lm = model("decoder")
    eng = engine(lm, max_rows=4)
    events = asyncio.new_event_loop()
    wakes, got, finished, at_once = [], [], threading.Event(), []
    wake = events.call_soon_threadsafe
    events.call_soon_threadsafe = lambda fn, *args: wakes.append(fn) or wake(fn, *args)
    loop = EngineLoop({"test": eng})

    def on_token(request, token):
        first, woken = request.generated == 1, len(wakes)
        loop.post(events, got.append, (request.id, token), now=first)
        if first:
            at_once.append(len(wakes) == woken + 1 and not loop.outbox)
        return False

    cases = [([5 + i, 6, 7], Params(max_new_tokens=6, rules=Rules(min_length=6)))
             for i in range(3)]
    requests = [Request(p, params, on_token=on_token,
                        on_finish=lambda _: all(r.finished for r in requests) and finished.set())
                for p, params in cases]

    async def all_arrived():
        while len(got) < 3 * 6:
            await asyncio.sleep(0.01)

    try:
        for r in requests:
            loop.submit("test", [r])
        assert finished.wait(timeout=60)
        events.run_until_complete(asyncio.wait_for(all_arrived(), timeout=30))
        loop.post(events, got.append, "from this thread")
        events.run_until_complete(asyncio.sleep(0))
    finally:
        loop.stop()
        events.close()
    assert len(got) == 3 * 6 + 1 and got[-1] == "from this thread"
    assert at_once == [True] * 3  # each request's first token: handed over in the hook
    assert 6 <= len(wakes) - 1 <= eng.steps + 3 < 18  # one per step, and one per first
    for (p, params), r in zip(cases, requests, strict=True):
        assert [t for i, t in got[:-1] if i == r.id] == r.output == alone(lm, p, params)


def test_a_posted_call_that_fails_does_not_stop_the_others_handed_over_with_it(capsys):
    import asyncio

    events, got = asyncio.new_event_loop(), []
    loop = EngineLoop({})

    def post_three():  # in the loop's thread, as a step's hooks
        loop.post(events, got.append, 1)
        loop.post(events, lambda: 1 / 0)
        loop.post(events, got.append, 3)

    try:
        loop.call(post_three).result(timeout=60)
        for _ in range(100):
            events.run_until_complete(asyncio.sleep(0.01))
            if got:
                break
    finally:
        loop.stop()
        events.close()
    assert got == [1, 3] and "ZeroDivisionError" in capsys.readouterr().err


def test_an_encoders_batches_run_in_the_models_thread_with_no_thread_of_their_own(
        served, monkeypatch):
    """Classify and embed requests are batched by the loop that steps the engines: they run
    in its thread, and the server starts no other thread for an encoder."""
    import threading

    from fastapi.testclient import TestClient

    from vaswani.serve import create_app

    run, ran_in = served["clf"], []
    probabilities = run.probabilities
    monkeypatch.setattr(run, "probabilities", lambda texts: ran_in.append(
        threading.current_thread().name) or probabilities(texts))
    with TestClient(create_app({"clf": run, "lm": served["lm"]}),
                    base_url="http://127.0.0.1") as c:
        names = {t.name for t in threading.enumerate()}
        answer = c.post("/v1/classify", json={"model": "clf", "input": ["a good b", "a b"]})
    assert answer.status_code == 200 and len(answer.json()["data"]) == 2
    assert ran_in == ["vaswani-models"]
    assert {n for n in names if n.startswith("vaswani-")} == {"vaswani-models"}


class Timed:
    """An engine stand-in: ``steps`` steps of ``seconds`` each, once ``start()`` is called."""

    waiting = 0

    def __init__(self, seconds: float, long: bool = False) -> None:
        from types import SimpleNamespace

        self.seconds, self.left, self.log = seconds, 0, None
        # its steps are a long prefill's chunks, or not
        self.scheduler = SimpleNamespace(last_long=long)
        self.model = __import__("torch").nn.Sequential()  # no layers: no yield points

    @property
    def busy(self) -> bool:
        return self.left > 0

    def start(self, steps: int, log: list) -> None:
        self.left, self.log = steps, log

    def step(self) -> list:
        import time

        time.sleep(self.seconds)
        self.left -= 1
        self.log.append(self)
        return []


def test_engines_share_the_loop_by_time_not_by_turns():
    """A model in a long prefill (steps of 40 ms) and a short request on another (steps of
    4 ms, 10 of them: one long step's worth): by turns, the short one would wait a long step
    for each of its own (10 of them); by time, it runs until it has had as much time, so at
    most a few long steps fall among its ten."""
    slow, fast = Timed(0.04, long=True), Timed(0.004)
    log: list = []
    loop = EngineLoop({"slow": slow, "fast": fast})
    try:
        loop.call(lambda: slow.start(30, log)).result(timeout=60)
        loop.call(lambda: None).result(timeout=60)  # the slow one has stepped a while
        loop.call(lambda: fast.start(10, log)).result(timeout=60)
        for _ in range(600):
            if not fast.busy:
                break
            loop.call(lambda: None).result(timeout=60)
    finally:
        loop.stop()
    first, last = log.index(fast), len(log) - 1 - log[::-1].index(fast)
    assert log[first:last + 1].count(slow) <= 2, [e is slow for e in log]


def test_another_models_request_steps_between_the_layers_of_a_long_prefill():
    """A request that arrives at one model while another is in a long prefill's pass does not
    wait for that pass: the loop steps it between two of the pass's layers, and both answer
    as they would alone."""
    first = engine(model("decoder", max_len=256), max_rows=4, max_step_tokens=128)
    second = engine(model("decoder"), max_rows=4)
    events = []
    late = Request([7, 8], Params(max_new_tokens=3))
    layers = first.model.decoder.layers
    forward = layers[0].forward

    def arrives(*args, **kwargs):  # during the long pass's first layer
        if not events:
            loop.submit("second", [late])
        events.append("first layer 0")
        return forward(*args, **kwargs)
    layers[0].forward = arrives
    step = second.step
    second.step = lambda: events.append("second steps") or step()
    loop = EngineLoop({"first": first, "second": second})
    try:
        long = Request([5 + i % 7 for i in range(200)], Params(max_new_tokens=2))
        loop.submit("first", [long])
        for _ in range(600):
            if long.finished and late.finished:
                break
            loop.call(lambda: None).result(timeout=60)
    finally:
        loop.stop()
    assert events.index("second steps") < events.index("first layer 0", 1), events
    assert late.first_token < long.first_token  # its first token before the long pass ends
    assert late.output == alone(second.model, [7, 8], late.params)
    assert long.output == alone(first.model, long.prompt, long.params)
    assert not layers[1]._forward_hooks  # stop() took the hooks away
