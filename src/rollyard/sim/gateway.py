"""The gateway as a queue of CPU servers: ``shards`` processes of ``cores_per_shard`` cores.

Each request passes it twice, on the way in (before the scheduler sees it) and on the way
back (before its client does), taking ``GatewayCost.in_s`` and ``out_s`` of one server. A
program stays on one shard, as the gateway shards its program table; within a shard jobs
wait first come, first served for a free core. Pure bookkeeping: the loop owns the clock and
the events, this says when a job ends and which waiting job a freed core takes next.
"""

from __future__ import annotations

import zlib
from collections import deque
from typing import Any

from rollyard.sim.costs import GatewayCost, shards_needed
from rollyard.sim.stats import quantile

__all__ = ["GatewayQueue"]


class GatewayQueue:
    def __init__(self, cost: GatewayCost) -> None:
        self.cost = cost
        self.free = [cost.cores_per_shard] * cost.shards
        self.waiting: list[deque[tuple[float, float, Any]]] = [deque() for _ in range(cost.shards)]
        self.busy_s = [0.0] * cost.shards  # CPU seconds each shard's cores spent
        self.waits: list[float] = []  # each job's wait for a core

    def shard_of(self, program_id: str) -> int:
        """A program's shard: a stable hash of its id, as a sharded gateway routes by program."""
        return zlib.crc32(program_id.encode()) % self.cost.shards

    def offer(self, shard: int, now: float, service_s: float, job: Any) -> float | None:
        """A job arrives; returns when it ends if a core was free (None: it waits)."""
        if self.free[shard]:
            self.free[shard] -= 1
            return self._start(shard, now, now, service_s)
        self.waiting[shard].append((now, service_s, job))
        return None

    def release(self, shard: int, now: float) -> tuple[float, Any] | None:
        """A job on ``shard`` ended: its core takes the next waiting job, (its end, the job)."""
        if not self.waiting[shard]:
            self.free[shard] += 1
            return None
        arrived, service_s, job = self.waiting[shard].popleft()
        return self._start(shard, now, arrived, service_s), job

    def _start(self, shard: int, now: float, arrived: float, service_s: float) -> float:
        self.waits.append(now - arrived)
        self.busy_s[shard] += service_s
        return now + service_s

    def summary(self, makespan_s: float) -> dict[str, float]:
        """Utilisation of all the gateway's cores, and of the busiest shard's, over the run."""
        cores = self.cost.cores_per_shard
        work = sum(self.busy_s)
        span = makespan_s or 1.0
        return {
            "gateway_shards": self.cost.shards,
            "gateway_cpu_s": work,
            "gateway_util": work / (span * self.cost.servers),
            "gateway_util_max_shard": max(self.busy_s) / (span * cores),
            "gateway_wait_p99_s": quantile(self.waits, 0.99),
            "gateway_shards_needed": shards_needed(work, span, cores),
        }
