"""The inference engine: continuous batching over a preallocated key/value cache (a slot per
row), for every decoder (engine.py; request.py, scheduler.py, cache.py, runner.py are its
parts; loop.py runs a server's engines in one thread of their own)."""

from .engine import Engine, EngineConfig
from .loop import Busy, EngineLoop
from .request import Params, Request, Status

__all__ = ["Busy", "Engine", "EngineConfig", "EngineLoop", "Params", "Request", "Status"]
