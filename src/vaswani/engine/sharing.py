"""What a server that shares one thread between engines sees of each (serve/loop.py): whether
the step under way is a long prefill's, and a hook after each layer of every pass, where the
server steps the other engines before the long pass goes on."""

from __future__ import annotations

from collections.abc import Callable

from ..nn.layers import DecoderLayer, EncoderLayer
from .engine import Engine


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
