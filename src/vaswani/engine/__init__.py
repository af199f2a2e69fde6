"""The inference engine: continuous batching over a preallocated key/value cache (a slot per
row), for every decoder (engine.py; its parts: request.py, scheduler.py, cache.py, runner.py,
sampler.py, beam.py; serve/loop.py runs a server's engines in one thread of their own)."""

from .engine import Engine, EngineConfig
from .request import Params, Request, Status

__all__ = ["Engine", "EngineConfig", "Params", "Request", "Status"]
