"""``[finetune]``: how a run started from another's weights (``[train] init_from``) learns.

``method = "full"`` trains every weight, as any run does. ``method = "lora"`` freezes them and
trains low-rank adapters on the layers named in ``targets`` (vaswani.nn.lora): only the
adapters are in the optimizer and in the run's checkpoints, the base weights are read from
``init_from`` whenever the run is loaded.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from .base import ConfigBase

TARGETS = ("q", "k", "v", "o", "gate", "up", "down")  # nn.lora.TARGETS, which nn/ owns
MAX_RANK = 4096


@dataclass(frozen=True)
class FinetuneConfig(ConfigBase):
    """What a fine-tuning run trains (``[finetune]``)."""

    SECTION = "finetune"

    method: Literal["full", "lora"] = "full"
    """"full": every weight is trained; "lora": low-rank adapters on the `targets`, the rest
    frozen (needs [train] init_from)."""
    rank: int = 8
    """LoRA: the rank r of each update B A."""
    alpha: float = 16.0
    """LoRA: the update is scaled by alpha / rank."""
    dropout: float = 0.0
    """LoRA: dropout on each adapter's input while training."""
    targets: list[str] = dataclasses.field(default_factory=lambda: ["q", "v"])
    """LoRA: the projections adapted, among q, k, v, o (attention's) and gate, up, down (the
    feed-forward's; a plain feed-forward has up and down)."""
    quantize: Literal["", "int8", "int4", "int4-g64"] = ""
    """QLoRA: the frozen weights kept in int8 or int4 (in groups of 32; "int4-g64": of 64)
    while the adapters train (language models, on a CPU); "" = float."""
    base_sha256: str = ""
    """LoRA: filled in when the run starts, the checksum of the init_from weights the
    adapters are trained on; a base whose weights have changed since is refused."""

    @property
    def lora(self) -> bool:
        return self.method == "lora"

    def validate(self) -> None:
        if not 1 <= self.rank <= MAX_RANK:
            raise ValueError(f"rank ({self.rank}) must be in [1, {MAX_RANK}]")
        if self.alpha <= 0:
            raise ValueError(f"alpha ({self.alpha}) must be positive")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout ({self.dropout}) must be in [0, 1)")
        if self.quantize and not self.lora:
            raise ValueError(f'quantize ({self.quantize!r}) is QLoRA\'s: it needs method = '
                             '"lora" (the weights it quantizes are frozen)')
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown or not self.targets or len(set(self.targets)) != len(self.targets):
            raise ValueError(f"targets ({list(self.targets)}) must be some of "
                             f"{', '.join(TARGETS)}, each once")

    def check_with(self, train) -> None:
        """Against the run's ``[train]``: LoRA adapts a run's weights (``init_from``), on one
        process or several (DDP, or FSDP's slices); QLoRA's int8/int4 layers are not sharded."""
        if not self.lora:
            return
        if not train.init_from:
            raise ValueError('[finetune] method = "lora" trains adapters on a run\'s weights: '
                             "set [train] init_from to that run (e.g. one made by vaswani "
                             "import)")
        if self.quantize and train.parallel == "fsdp":
            raise ValueError(f'[finetune] quantize = "{self.quantize}" (QLoRA) trains on one '
                             'process or with parallel = "ddp": FSDP shards float weights, '
                             "not int8/int4 layers (LoRA without quantize trains sharded, "
                             "its frozen float weights sliced over the processes)")
