"""What a server sees of its engines: the figures /health and /metrics report, and, as it
shares one thread between them (serve/loop.py), whether the step under way is a long
prefill's and a hook after each layer of every pass, where the server steps the other
engines before the long pass goes on."""

from __future__ import annotations

from collections.abc import Callable

from ..nn.layers import DecoderLayer, EncoderLayer
from .engine import Engine


def stats(engine: Engine) -> dict:
    """Its requests, its cache, the tokens it made and prefilled, and its kept prefixes."""
    s, c = engine.scheduler, engine.cache
    return {"waiting": len(s.waiting), "running": len(s.running), "rows": s.rows,
            "slots_used": c.used, "slots": c.rows, "slot_width": c.width,
            "preemptions": s.preemptions, "tokens_out": engine.tokens_out,
            "steps": engine.steps, "prefilled_tokens": s.prefilled_tokens,
            **s.prefixes.stats()}


def long_step(engine: Engine) -> bool:
    """Whether the engine's step under way (or its last one) prefills a long prompt's chunk:
    one a server lets other models step in the middle of."""
    return engine.scheduler.last_long


def between_layers(engine: Engine, fn: Callable[[], None]) -> list:
    """Have ``fn()`` called after each encoder or decoder layer of every pass over the
    engine's model; returns the hooks' handles, each to ``remove()``."""
    return [module.register_forward_hook(lambda *_: fn())
            for module in engine.model.modules()
            if isinstance(module, (EncoderLayer, DecoderLayer))]
