"""Data-parallel training with torch.distributed (gloo on CPU, nccl on CUDA).

``torchrun --nproc_per_node=N -m vaswani train CONFIG`` starts N processes; each reads the
rank and world size that torchrun puts in its environment (the CLI passes them here), builds
the same global batches, and trains on its own slice of each. Gradients are averaged by DDP;
the loss is normalised by the token count of the *global* batch, so N processes take exactly
the step one process would take on the combined batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Dist:
    """This process's place among the training processes, and the collectives they share
    (each a no-op for a single process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    enabled: bool = field(init=False)  # more than one process
    is_main: bool = field(init=False)  # rank 0: the one that writes files and logs

    def __post_init__(self) -> None:
        object.__setattr__(self, "enabled", self.world > 1)
        object.__setattr__(self, "is_main", self.rank == 0)

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.broadcast(t, src=0)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape on all ranks), in rank order."""
        if not self.enabled:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return out

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()


def init(rank: int, world: int, local_rank: int, device: torch.device) -> Dist:
    """Join the process group torchrun set up (no-op for a single process)."""
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Dist(rank, world, local_rank)


def shutdown(d: Dist) -> None:
    if d.enabled and dist.is_initialized():
        dist.destroy_process_group()
