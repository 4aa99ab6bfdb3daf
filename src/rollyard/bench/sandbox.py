"""``rollyard bench sandbox``: create + exec ``true`` + destroy latency, bwrap vs the unisolated
local baseline, and pool throughput with 32 concurrent programs on bwrap."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollyard.bench._report import report
from rollyard.sandbox import BwrapProvider, LocalProvider, SandboxPool, SandboxSpec
from rollyard.sandbox.base import SandboxProvider


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _cpu_s() -> float:
    """CPU seconds used so far by this process and its reaped children: a load-independent cost."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


async def _lifecycles(
    provider: SandboxProvider, n: int, phases: dict[str, list[float]] | None = None
) -> tuple[list[float], int, int, float]:
    """``n`` create + exec ``true`` + close; wall ms each, leaks, failures, CPU ms per lifecycle.
    ``phases`` collects the wall ms of each step, to show where a regression went."""
    times, leaks, failures = [], 0, 0
    steps = phases if phases is not None else {}
    cpu0 = _cpu_s()
    for _ in range(n):
        t0 = time.perf_counter()
        sb = await provider.create(SandboxSpec())
        t1 = time.perf_counter()
        r = await sb.exec(["true"])
        t2 = time.perf_counter()
        await sb.close()
        t3 = time.perf_counter()
        times.append((t3 - t0) * 1000)
        for name, a, b in (("create", t0, t1), ("exec", t1, t2), ("close", t2, t3)):
            steps.setdefault(name, []).append((b - a) * 1000)
        leaks += int(getattr(sb, "leaked", 0))
        failures += int(r.rc != 0)
    return times, leaks, failures, (_cpu_s() - cpu0) / n * 1000


async def _pool_throughput(provider: BwrapProvider, programs: int, rounds: int) -> tuple[float, int]:
    pool = SandboxPool(provider, ahead=8, reap_interval_s=0)
    pool.register("bench", SandboxSpec())

    async def program(i: int) -> None:
        sb = await pool.acquire("bench", f"p{i}")
        await sb.exec(["true"])
        await pool.release(f"p{i}")

    t0 = time.perf_counter()
    for r in range(rounds):
        await asyncio.gather(*(program(r * programs + i) for i in range(programs)))
    dt = time.perf_counter() - t0
    await pool.close()
    return programs * rounds / dt, pool.stats.leaks


async def _run(quick: bool, root: Path) -> dict[str, Any]:
    n = 30 if quick else 200
    bwrap = BwrapProvider(root / "bwrap")
    local = LocalProvider(root / "local", unsafe=True)
    await _lifecycles(bwrap, 3)  # warm caches
    phases: dict[str, list[float]] = {}
    b_times, b_leaks, b_fail, b_cpu = await _lifecycles(bwrap, n, phases)
    l_times, l_leaks, l_fail, l_cpu = await _lifecycles(local, n)
    per_s, p_leaks = await _pool_throughput(bwrap, 32, 2 if quick else 5)
    stray = bwrap.leftover_processes()  # any process under any sandbox uid, now that all are closed
    return {
        "cpu_ms": {"bwrap": b_cpu, "local": l_cpu},
        "phases_p50_ms": {name: _pct(xs, 0.5) for name, xs in phases.items()},
        "stray_processes": stray,
        "bwrap_ms": b_times,
        "local_ms": l_times,
        "pool_per_s": per_s,
        "leaks": b_leaks + l_leaks + p_leaks + stray,
        "leak_parts": {"bwrap": b_leaks, "local": l_leaks, "pool": p_leaks, "stray": stray},
        "failures": b_fail + l_fail,
    }


def main(quick: bool = False) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="ry-bench-sandbox-"))
    os.chmod(root, 0o711)
    try:
        res = asyncio.run(_run(quick, root))
        left = [
            p for sub in ("bwrap", "local") for p in (root / sub).iterdir() if not p.name.startswith(".etc-")
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    b, loc = res["bwrap_ms"], res["local_ms"]
    summary = {
        "p50_ms": _pct(b, 0.5),
        "p99_ms": _pct(b, 0.99),
        "lifecycles_per_s": res["pool_per_s"],
        "leaks": res["leaks"] + len(left),
    }
    details = {
        "bwrap": {
            "p50_ms": _pct(b, 0.5),
            "p99_ms": _pct(b, 0.99),
            "mean_ms": statistics.fmean(b),
            "cpu_ms_per_lifecycle": res["cpu_ms"]["bwrap"],
            "phases_p50_ms": res["phases_p50_ms"],
            "n": len(b),
        },
        "local": {
            "p50_ms": _pct(loc, 0.5),
            "p99_ms": _pct(loc, 0.99),
            "mean_ms": statistics.fmean(loc),
            "cpu_ms_per_lifecycle": res["cpu_ms"]["local"],
        },
        "bwrap_over_local_p50": _pct(b, 0.5) / _pct(loc, 0.5),
        "pool": {"programs": 32, "lifecycles_per_s": res["pool_per_s"]},
        "goal": "p50_ms <= 25, leaks == 0",
        "leak_parts": res["leak_parts"],
        "left_behind": [str(p) for p in left],
        "exec_failures": res["failures"],
        "load_avg": os.getloadavg(),
    }
    return report("sandbox", summary, details)
