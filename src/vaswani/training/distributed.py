"""Data-parallel training with torch.distributed (gloo on CPU, nccl on CUDA).

``torchrun --nproc_per_node=N -m vaswani train CONFIG`` starts N processes; each reads the
rank and world size that torchrun puts in its environment (the CLI passes them here), builds
the same global batches, and trains on its own slice of each. Gradients are averaged by DDP;
the loss is normalised by the token count of the *global* batch, so N processes take exactly
the step one process would take on the combined batch.

With ``[train] parallel = "fsdp"`` the model is sharded instead (sharding.py); FSDP needs a
process group even for one process, so one of size 1 is made then (a run saved by N sharded
processes resumes in one, and a single GPU trains the way N do).
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist


class RankZeroFailed(RuntimeError):
    """Raised by the other ranks when rank 0 failed at a step it does alone (starting the run,
    saving, evaluating): rank 0 reports why, and the other ranks say in one line what rank 0
    was doing, or (``quiet``: a refusal to start, which rank 0's one line says all of) nothing,
    so that a refusal reads once, not once per rank."""

    def __init__(self, message: str, *, quiet: bool = False) -> None:
        super().__init__(message)
        self.quiet = quiet

@dataclass(frozen=True)
class Dist:
    """This process's place among the training processes, and the collectives they share
    (each a no-op for a single process)."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False  # init() made the process group, shutdown() ends it
    # the group for waiting on rank 0's work alone (broadcast, barrier): no short timeout;
    # None: the default group (a single process, or a group init() did not make)
    waits: object = None
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
        """Rank 0's ``t`` on every rank; used where the others wait for rank 0's work alone,
        so without the step's timeout (:func:`init`)."""
        if self.enabled:
            dist.broadcast(t, src=0, group=self.waits)
        return t

    def all_gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's ``t`` (same shape on all ranks), in rank order."""
        if not self.enabled:
            return [t]
        out = [torch.empty_like(t) for _ in range(self.world)]
        dist.all_gather(out, t)
        return out

    def barrier(self) -> None:
        """Every rank here; without the step's timeout, like :meth:`broadcast`."""
        if self.enabled:
            dist.barrier(group=self.waits)


def die_with_launcher() -> bool:
    """Under torchrun (its agent is this process's parent): ask Linux to SIGKILL this process
    when the agent dies. torchrun starts each rank in a session of its own, so a torchrun that
    is itself killed (SIGKILL, the OOM killer, a test's timeout) would leave its ranks running,
    orphaned, holding the run directory's lock and waiting at a collective. With nothing left
    to coordinate the ranks, dying is right: the last checkpoint stays whole (saving is
    atomic). Whether it was asked (False: not under torchrun, or not Linux)."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return False
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0):
        return False
    if os.getppid() != parent:  # the agent died before the request was in place
        os.kill(os.getpid(), signal.SIGKILL)
    return True


def backend(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes (and on machines without NCCL)."""
    return "nccl" if device.type == "cuda" and dist.is_nccl_available() else "gloo"


WAIT_TIMEOUT = timedelta(days=7)  # waiting for rank 0's work alone: only a dead rank ends it


def init(rank: int, world: int, local_rank: int, device: torch.device, *,
         group_of_one: bool = False, timeout: float = 300.0) -> Dist:
    """Join the process group torchrun set up (no-op for a single process, unless
    ``group_of_one``: then a group of this process alone, as FSDP needs one).

    Two groups over the same ranks: the default one, which DDP, FSDP and a step's exchanges
    use, gives up after ``timeout`` seconds (``[train] collective_timeout``: a rank that hangs
    without dying ends the job with an error instead of stalling it); ``Dist.waits``, for the
    broadcasts and barriers where the others wait for rank 0's work alone (encoding data,
    evaluating, saving), which may rightly take long."""
    if dist.is_initialized():
        return Dist(rank, world, local_rank)
    if world > 1:
        dist.init_process_group(backend(device), store=_attempt_store(), rank=rank,
                                world_size=world, timeout=timedelta(seconds=timeout))
        waits = dist.new_group(timeout=WAIT_TIMEOUT, backend=backend(device))
        return Dist(rank, world, local_rank, owns_group=True, waits=waits)
    if group_of_one:
        dist.init_process_group(backend(device), store=dist.HashStore(), rank=0, world_size=1)
    else:
        return Dist(rank, world, local_rank)
    return Dist(rank, world, local_rank, owns_group=True)


SHARED_STORE_ADVICE = (
    "torchrun restarts processes on several machines (--max-restarts with several nodes), "
    "and its agents share one store across restarts: after one machine's processes restart, "
    "the machines' restart counts can differ and the restarted group would wait for each "
    "other until the timeout. Start every torchrun with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
    "in its environment (each restart then meets at a new store; docs/distributed.md)")


@functools.cache
def _attempt_store() -> dist.Store:
    """The store this attempt of the job meets at, made once per process (rank 0 may host it).

    Where torchrun's agents share their store across restarts (its default,
    ``TORCHELASTIC_USE_AGENT_STORE=True``), keys are kept apart for each attempt by its restart
    count: a rank that starts before its peers of the next attempt would otherwise read the
    dead ranks' addresses under the same keys and fail to connect (gloo's "connectFullMesh
    failed ... Connection refused"). The count is the same on every rank of one machine, but
    torchrun does not count a restart made for a change of membership (another machine's
    processes rejoining), so on several machines with restarts the counts can differ: there a
    store of each attempt's own is needed (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: rank 0
    hosts it, at a port torchrun picks anew for each attempt), and its absence is an error."""
    shared = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if (shared and int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0
            and int(os.environ.get("GROUP_WORLD_SIZE", "1")) > 1):
        raise RuntimeError(SHARED_STORE_ADVICE)
    store, _, _ = next(dist.rendezvous("env://"))
    if not shared:
        return store
    return dist.PrefixStore(
        f"vaswani/attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', 0)}", store)


def rank0_decides(key: str, decide: Callable[[], str], rank: int, world: int) -> str:
    """Rank 0's answer to a question every rank must answer alike before the process group
    exists (whether a restarted job continues its run), shared through the store the group
    starts from: on several machines the ranks' environments need not agree."""
    if world == 1:
        return decide()
    store = _attempt_store()
    if rank == 0:
        store.set(f"vaswani/{key}", decide())
    return store.get(f"vaswani/{key}").decode()


def shutdown(d: Dist) -> None:
    """End the process group; the caller has let go of the model first.

    gloo's worker threads let go of a finished collective's tensors after the caller has its
    result, and letting go of a tensor Python also holds takes the GIL. The group's destructor
    waits for those threads: run with the GIL held, it deadlocks (seen at the end of
    two-process CPU runs, a thread freeing a broadcast's tensors). Python drops its last
    reference to a group with the GIL released, but DDP's reducer, freed like any Python
    object, drops its reference with the GIL held; so the model goes first (train.py) and the
    group is then destroyed here, from Python. A run that finished calls ``Dist.barrier``
    before: every earlier collective is done. (After a failure there is no barrier: a dead
    rank would never reach it.)"""
    if d.owns_group and dist.is_initialized():
        dist.destroy_process_group()
