"""The engine's size: its config, the caches it makes for a model (a slot per row, and the
kept prompt prefixes), and the fast lane's default (scheduler.py says what the lane is
for)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache import SlotCache
from .prefixes import PrefixCache
from .scheduler import Scheduler

FAST_LANE = 32  # a CPU's fast lane: requests of at most this many tokens (scheduler.py)
KV_CACHE = {"bf16": torch.bfloat16}  # the key/value cache's dtypes by name (--kv-cache)
# A translator's sources are encoded in passes padded within a sixteenth of their tokens and
# 8 positions (scheduler.py length_groups), not a prompt's quarter and prefill_slack: an
# encoder pass is all products, each position at about the CPU's float32 peak, so a padded
# position costs as much as a token and one pass more little (the demo translator's 150
# test verses made five passes, 22% of their positions padding, and its calls ~2% slower).
SOURCE_SHARE, SOURCE_SLACK = 16, 8


def fast_lane_for(device: torch.device) -> int:
    """The fast lane's default: on a CPU, where a step costs about its rows; none on a GPU,
    where a step of many rows costs what a step of one does (scheduler.py)."""
    return FAST_LANE if device.type == "cpu" else 0


@dataclass(frozen=True)
class EngineConfig:
    """The engine's size."""

    max_rows: int = 64  # sequences decoded together at most (a beam search takes `beam`)
    max_step_tokens: int = 1024  # prompt tokens prefilled in one step at most (longer: chunks);
    # also the padded positions of one encoder pass at most (a longer source: a pass alone)
    cache_tokens: int = 0  # token positions the cache holds, all rows and sources together;
    # 0: max_rows full-length rows (and their sources), within cache_bytes
    cache_bytes: int = 1 << 30  # the cache's memory at most, when cache_tokens is 0
    prefix_bytes: int = 1 << 28  # of which kept prompt prefixes hold at most this many
    # (a language model's; prefixes.py); 0: none kept
    cuda_graphs: bool = True  # on a GPU: decode steps as CUDA graphs (graphs.py)
    fast_lane: int | None = None  # requests of at most this many tokens decoded at every
    # step, the others at every other step while they run (scheduler.py); None: 32 on a CPU,
    # 0 (no lane) on a GPU
    shared_chunk: int = 32  # a prefill of more tokens than this and than max_step_tokens,
    # beside other work, runs in chunks of this many in steps of its own, taking turns with
    # the others by time (scheduler.py); 0: off (an offline call, where only the total time
    # counts)
    prefill_slack: int = 32  # prompts prefilled in one padded pass may waste this many
    # positions beyond a quarter of their tokens (scheduler.py length_groups); larger:
    # fewer, more padded passes
    cache_dtype: torch.dtype | None = None  # the keys and values kept in this dtype (None:
    # the model's). torch.bfloat16 under a float32 model: half the memory a token (twice
    # the tokens in cache_bytes), read back as float32 by the attention; each key rounded
    # to 8 bits of mantissa, so the tokens may differ from float32's where two are close
    bf16_prefill: bool = False  # a language model's prompts' int8 weight-only products
    # in bfloat16, where the CPU has bfloat16 products (cpu/quantized.py widened): faster
    # at a prompt's many rows. By role (runner.py): a prompt of WIDEN_FROM tokens or more
    # is computed widened and its generated tokens by the int8 kernel, whatever pass
    # carries them, so a completion is still the same bits alone and in any batch

    def __post_init__(self) -> None:
        for name in ("max_rows", "max_step_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} ({getattr(self, name)}) must be positive")
        if not 0 <= self.prefix_bytes < self.cache_bytes:
            raise ValueError(f"prefix_bytes ({self.prefix_bytes}) must be 0 (none kept) or "
                             f"more, and less than cache_bytes ({self.cache_bytes})")
        if self.prefill_slack < 0:
            raise ValueError(f"prefill_slack ({self.prefill_slack}) must be 0 or more")
        if self.shared_chunk < 0:
            raise ValueError(f"shared_chunk ({self.shared_chunk}) must be 0 (off) or more")
        if self.fast_lane is not None and self.fast_lane < 0:
            raise ValueError(f"fast_lane ({self.fast_lane}) must be 0 (none) or more")

    @classmethod
    def offline(cls, max_rows: int, **options) -> EngineConfig:
        """An offline call's engine (``translate``, ``generate_many``, a validation metric):
        every request's tokens count alike and only the total time does (no fast lane, no
        shared chunk), in wide steps (``max_step_tokens`` 4,096), keeping no prefixes (its
        inputs come at once); ``options`` override."""
        return cls(max_rows=max_rows, **{"max_step_tokens": 4096, "fast_lane": 0,
                                         "shared_chunk": 0, "prefix_bytes": 0, **options})

    def lane(self, device: torch.device) -> int:
        """The fast lane on ``device``: as given, or its default there."""
        return fast_lane_for(device) if self.fast_lane is None else self.fast_lane

    def cache_for(self, model: torch.nn.Module, seq2seq: bool) -> SlotCache:
        """The key/value cache for ``model``'s decoder layers: ``cache_tokens`` positions, or
        as many as ``cache_bytes`` holds beside the kept prefixes, on the model's device and
        in ``cache_dtype`` (default: the model's dtype)."""
        c, param = model.config, next(model.parameters())
        head_dim, dtype = c.head_dim, self.cache_dtype or param.dtype
        per_token = 2 * c.n_decoder_layers * c.n_kv_heads * head_dim * dtype.itemsize
        slots = self.cache_bytes - self.prefix_bytes * (not seq2seq)
        return SlotCache(c.n_decoder_layers, c.n_kv_heads, head_dim,
                         tokens=self.cache_tokens or slots // per_token,
                         max_rows=self.max_rows, max_len=c.max_len, seq2seq=seq2seq,
                         dtype=dtype, device=param.device, compute=param.dtype)

    def scheduler_for(self, cache: SlotCache, max_len: int, device: torch.device) -> Scheduler:
        """The scheduler of an engine with ``cache``, for a model of ``max_len`` positions on
        ``device``."""
        return Scheduler(cache, max_rows=self.max_rows, max_step_tokens=self.max_step_tokens,
                         max_len=max_len, fast_lane=self.lane(device),
                         shared_chunk=self.shared_chunk, prefixes=self.prefixes_for(cache))

    def prefixes_for(self, cache: SlotCache) -> PrefixCache:
        """The kept prompt prefixes of an engine with ``cache``: none for a translator (its
        prompt is a source, encoded once a request)."""
        return PrefixCache(cache, 0 if cache.seq2seq else self.prefix_bytes)
