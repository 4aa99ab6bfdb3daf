"""The soak's view of the gateway process from outside: its memory, descriptors, loop thread and
loop-lag histogram, sampled over the run and at the slow-client phase's edges.

Why the edges: the slow phase's cost is what changes across them. The loop thread's CPU time
and the loop-lag histogram are read at the run's start, the phase's start, the end of its ramp
and its end, so the lag inside the phase is the gateway's own figure (a ``/health`` client's
latency also holds that client's own wait for a CPU on a loaded host). Memory is sampled with
the gateway's open descriptors, so a figure taken after the phase can show that its
connections were in fact closed when it was taken.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from rollyard.bench._procs import ADMIN
from rollyard.bench._prom import histogram_buckets


def schedstat(pid: int) -> tuple[float, float, int]:
    """The gateway's event-loop thread (its main thread): seconds on a CPU, seconds runnable but
    waiting for one, and how many times it was scheduled (``/proc/PID/task/PID/schedstat``)."""
    run_ns, wait_ns, slices = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[:3]
    return int(run_ns) / 1e9, int(wait_ns) / 1e9, int(slices)


def host_cpu_pressure_s() -> float | None:
    """Seconds in which some task on the host waited for a CPU (PSI ``some`` total); None
    where the kernel has no pressure stall information."""
    try:
        line = Path("/proc/pressure/cpu").read_text().splitlines()[0]
    except OSError:
        return None
    return int(line.rsplit("total=", 1)[1]) / 1e6


def memory_mb(pid: int) -> tuple[float, float]:
    """The process's resident memory and the anonymous part of it (its heap: what it allocated),
    in MB. Why both: file-backed pages (shared libraries, the mapped tokenizer) leave and come
    back with the host's reclaim (this machine pages cold memory out, DAMON), so the whole RSS
    moved by tens of MB in runs where the process allocated nothing."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    kb = [int(fields.get(k, "0 kB").split()[0]) for k in ("VmRSS", "RssAnon")]
    return kb[0] / 1024, kb[1] / 1024


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def lag_buckets(url: str) -> dict[float, float]:
    """The gateway's loop-lag histogram: upper bound -> cumulative count."""
    text = httpx.get(f"{url}/metrics", headers={"x-api-key": ADMIN}).text
    return histogram_buckets(text, "rollyard_gateway_loop_lag_seconds")


def bucket_quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The ``q`` quantile of what a cumulative histogram observed between two scrapes, linear
    within its bucket as Prometheus' ``histogram_quantile`` is (the highest finite bound if it
    falls in +Inf); 0 with no observations."""
    les = sorted(after)
    counts = [after[le] - before.get(le, 0.0) for le in les]
    if not counts or counts[-1] <= 0:
        return 0.0
    rank = q * counts[-1]
    lo, below = 0.0, 0.0
    for le, n in zip(les, counts, strict=True):
        if n >= rank:
            return lo if math.isinf(le) else lo + (le - lo) * (rank - below) / (n - below)
        lo, below = le, n
    return lo


@dataclass
class Mark:
    at: float
    loop_cpu_s: float
    lag: dict[float, float]


@dataclass
class GatewayWatch:
    """Samples of gateway ``pid`` (served at ``url``): (seconds since ``start``, RSS MB, open
    descriptors) every second until ``until``, and a ``Mark`` at each of ``edges``."""

    url: str
    pid: int
    start: float
    memory: list[tuple[float, float, float, int]] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)

    def sample(self) -> None:
        rss, anon = memory_mb(self.pid)
        self.memory.append((time.perf_counter() - self.start, rss, anon, open_fds(self.pid)))

    async def sample_until(self, until: float) -> None:
        while time.perf_counter() < until:
            self.sample()
            await asyncio.sleep(1.0)

    async def mark(self, edges: tuple[float, ...]) -> None:
        for at in edges:
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            lag = await asyncio.to_thread(lag_buckets, self.url)
            self.marks.append(Mark(time.perf_counter(), schedstat(self.pid)[0], lag))

    def phase_figures(self, warm_from: float) -> dict[str, float]:
        """With four marks (run start, phase start, ramp done, phase end): the loop thread's
        share of a core and the loop lag p99 before the phase and while it held its connections;
        memory from ``warm_from`` seconds on, as RSS (``rss_*``) and its anonymous part
        (``anon_rss_*``): growth at the end, after the phase's connections closed
        (``*_growth``), and the most while they were open (``*_growth_slow_held``)."""
        warm = [m for m in self.memory if m[0] >= warm_from] or self.memory
        out: dict[str, float] = {"gateway_fds_end": warm[-1][3]}
        held = warm
        if len(self.marks) == 4:
            m0, m1, m2, m3 = self.marks
            held = [m for m in self.memory if m2.at - self.start <= m[0] <= m3.at - self.start] or warm
            before = [m for m in self.memory if m[0] <= m1.at - self.start] or warm
            out.update(
                {
                    "loop_cpu_share_before_slow": (m1.loop_cpu_s - m0.loop_cpu_s) / (m1.at - m0.at),
                    "loop_cpu_share_during_slow": (m3.loop_cpu_s - m2.loop_cpu_s) / (m3.at - m2.at),
                    "loop_lag_p99_ms_before_slow": 1000 * bucket_quantile(m0.lag, m1.lag, 0.99),
                    "slow_loop_lag_p99_ms": 1000 * bucket_quantile(m2.lag, m3.lag, 0.99),
                    "gateway_fds_before_slow": before[-1][3],
                    "gateway_fds_slow_held": max(m[3] for m in held),
                }
            )
        for name, i in (("rss", 1), ("anon_rss", 2)):
            base, peak = warm[0][i], max(m[i] for m in held)
            out[f"{name}_mb_after_warmup"], out[f"{name}_mb_end"] = base, warm[-1][i]
            out[f"{name}_growth"] = (warm[-1][i] - base) / base if base else 0.0
            out[f"{name}_mb_slow_held"] = peak
            out[f"{name}_growth_slow_held"] = (peak - base) / base if base else 0.0
        return out
