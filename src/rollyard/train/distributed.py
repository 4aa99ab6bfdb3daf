"""Data parallel over torch.distributed: each rank trains its shard, gradients are summed once per step.

We all-reduce the accumulated gradients ourselves instead of wrapping the model in DDP: with tree
packing, ranks hold different numbers of micro-batches, and DDP's per-backward hooks (or
``no_sync`` bookkeeping) would then need every rank to run the same number of backward passes.
One flat all-reduce after accumulation is the same arithmetic as DDP with ``no_sync`` and cannot
deadlock on uneven shards. Losses are already weighted by global totals, so a SUM is exact.
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
    """This process's place in the group; ``world == 1`` means no communication at all."""

    rank: int = 0
    world: int = 1

    @staticmethod
    def from_env() -> DataParallel:
        if dist.is_available() and dist.is_initialized():
            return DataParallel(rank=dist.get_rank(), world=dist.get_world_size())
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
        t = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.tolist()

    def sum_grads(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Sum every parameter's gradient over ranks (missing gradients count as zeros)."""
        if not self.active:
            return
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))  # type: ignore[union-attr]
            offset += n

    def broadcast_params(self, module: torch.nn.Module) -> None:
        """Start every rank from rank 0's weights."""
        if not self.active:
            return
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src=0)
