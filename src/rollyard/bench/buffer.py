"""``rollyard bench buffer``: release rules under long-tail generation, on a simulated clock.

N generators each run one rollout at a time; a rollout's length is lognormal (a long tail)
and takes length / rate seconds. When one finishes, its slot starts the next with the current
policy version, unless the buffer already holds ``capacity`` rollouts (running or waiting), as
a real pool bounds its backlog; parked slots restart when the trainer takes rollouts. A
trainer takes batches of B rollouts through the buffer, trains for a fixed time and bumps the
version. Every rule runs on the same random stream. Reported per rule: the trainer's idle
fraction, the staleness (trainer version minus rollout version) of what it consumed, and the
short bias: mean consumed length / mean generated length (1 = unbiased).
"""

from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass
from typing import Any

from rollyard.bench._report import report
from rollyard.core.clock import FakeClock
from rollyard.rl.buffer import BufferConfig, ReleaseRule, WindowedFifo


@dataclass(frozen=True)
class SimParams:
    generators: int = 64
    batch: int = 16
    capacity: int = 128  # rollouts running or waiting in the buffer
    steps: int = 200
    train_s: float = 8.0
    tokens_per_s: float = 50.0
    median_tokens: float = 1500.0
    sigma: float = 1.0  # lognormal shape: the tail
    seed: int = 0


def simulate(config: BufferConfig, p: SimParams) -> dict[str, Any]:
    """Run one rule to ``p.steps`` trainer steps; returns its metrics."""
    rng = random.Random(p.seed)
    clock = FakeClock()
    buf = WindowedFifo(config, clock)
    running: list[tuple[float, int, str]] = []
    lengths: dict[str, int] = {}
    version, steps, idle, n, parked = 0, 0, 0.0, 0, 0
    consumed_len: list[int] = []
    staleness: list[int] = []
    batch: list[Any] = []
    busy_until: float | None = None

    def start() -> None:
        nonlocal n
        item = f"r{n}"
        length = max(1, int(rng.lognormvariate(0.0, p.sigma) * p.median_tokens))
        lengths[item] = length
        buf.submit(item, policy_version=version)
        heapq.heappush(running, (clock.now() + length / p.tokens_per_s, n, item))
        n += 1

    for _ in range(p.generators):
        start()
    while steps < p.steps:
        if busy_until is None:
            got = buf.release(version, p.batch - len(batch))
            batch.extend(got.items)
            while parked and len(buf) < p.capacity:
                parked -= 1
                start()
            if len(batch) >= p.batch:
                consumed_len.extend(r.length for r in batch)
                staleness.extend(r.staleness for r in batch)
                batch = []
                busy_until = clock.now() + p.train_s
        if not running and busy_until is None:
            raise RuntimeError("simulation stalled: nothing running and the trainer is waiting")
        t_next = min(
            running[0][0] if running else float("inf"), busy_until if busy_until is not None else float("inf")
        )
        if busy_until is None:
            idle += t_next - clock.now()
        clock.advance(t_next - clock.now())
        if busy_until is not None and busy_until <= clock.now():
            busy_until = None
            version += 1
            steps += 1
        while running and running[0][0] <= clock.now():
            _, _, item = heapq.heappop(running)
            buf.complete(item, length=lengths[item])
            if len(buf) < p.capacity:
                start()
            else:
                parked += 1
    total = clock.now()
    generated = statistics.fmean(lengths.values())
    return {
        "idle_frac": idle / total if total > 0 else 0.0,
        "staleness_mean": statistics.fmean(staleness),
        "staleness_max": max(staleness),
        "short_bias": statistics.fmean(consumed_len) / generated,
        "consumed": len(consumed_len),
        "sim_seconds": total,
        "queued_at_end": len(buf),
    }


RULES: dict[str, BufferConfig] = {
    "window": BufferConfig(rule=ReleaseRule.WINDOW, window_fraction=0.3),
    "fifo": BufferConfig(rule=ReleaseRule.FIFO),
    "freshest": BufferConfig(rule=ReleaseRule.FRESHEST),
    "window_k2_drop": BufferConfig(rule=ReleaseRule.WINDOW, window_fraction=0.3, max_staleness=2),
}


def main(quick: bool = False) -> dict[str, Any]:
    params = SimParams(steps=40 if quick else 300)
    results = {name: simulate(cfg, params) for name, cfg in RULES.items()}
    w, f = results["window"], results["fifo"]
    summary = {
        "window_idle": w["idle_frac"],
        "fifo_idle": f["idle_frac"],
        "window_staleness": w["staleness_mean"],
        "short_bias": w["short_bias"],
    }
    details = {"params": params.__dict__, "rules": {k: v.model_dump(mode="json") for k, v in RULES.items()}}
    return report("buffer", summary, {**details, "results": results})
