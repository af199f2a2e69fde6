"""The inference engine: continuous batching over a paged key/value cache, for every decoder
(engine.py; request.py, scheduler.py, cache.py, runner.py are its parts; loop.py runs one in
a thread of its own, for the server)."""

from .engine import Engine, EngineConfig
from .loop import Busy, EngineLoop
from .request import Params, Request, Status

__all__ = ["Busy", "Engine", "EngineConfig", "EngineLoop", "Params", "Request", "Status"]
