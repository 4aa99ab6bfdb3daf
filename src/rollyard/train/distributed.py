"""Data parallel over torch.distributed: which shard of the batch a rank trains, and the few
scalars ranks agree on (batch totals, metrics, the number of passes).

Gradients are not moved here: FSDP2 (``train/sharding.py``) reduces them in every backward.
Losses are weighted by the global batch's totals, so those reductions are sums.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


def leave_group(timeout_s: float = 30.0) -> None:
    """Leave the process group together with the other ranks, then destroy it.

    A gloo rank that destroys its group while another is still tearing its own down can die
    in C++ (``terminate called without an active exception``, SIGABRT; seen once in CI, about
    1 run in 20 of the two-rank test on a loaded machine). A barrier first makes every rank
    finish its last collective before any leaves. gloo's ``monitored_barrier`` gives up after
    ``timeout_s`` when a rank is gone, so a dead worker cannot hang the survivor's shutdown;
    nccl has no such barrier, and there a plain ``destroy`` is what is safe.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    if dist.get_backend() == "gloo":
        with contextlib.suppress(RuntimeError):  # a rank is gone: leave anyway
            dist.monitored_barrier(timeout=timedelta(seconds=timeout_s))
    dist.destroy_process_group()


@dataclass(frozen=True)
class DataParallel:
    """This process's place in the group; ``world == 1`` means no communication at all.

    ``group``: a process group is up, so the trainer wraps its model with FSDP2 (even at one
    rank, where that is how bf16 mixed precision runs)."""

    rank: int = 0
    world: int = 1
    group: bool = False

    @staticmethod
    def from_env() -> DataParallel:
        if dist.is_available() and dist.is_initialized():
            return DataParallel(rank=dist.get_rank(), world=dist.get_world_size(), group=True)
        return DataParallel()

    @property
    def active(self) -> bool:
        return self.world > 1

    def shard(self, items: Sequence[T]) -> list[T]:
        """A contiguous slice per rank, so neighbours (a group, a trajectory's calls) stay together."""
        n = len(items)
        lo, hi = n * self.rank // self.world, n * (self.rank + 1) // self.world
        return list(items[lo:hi])

    def sum_floats(self, values: list[float]) -> list[float]:
        if not self.active:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def max_int(self, value: int) -> int:
        """The largest ``value`` over ranks (how many passes the busiest rank runs)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=_comm_device())
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())


def _comm_device() -> torch.device:
    """nccl reduces only CUDA tensors; gloo takes CPU ones."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
