"""``rollyard bench soak``: many programs, many connections, hostile bodies, for a bounded time.

A ``rollyard gateway`` process in front of a real vLLM: ``PROGRAMS`` programs registered up
front, ``CONCURRENCY`` clients on keep-alive connections each running multi-turn
conversations (streaming and not, alternating), finishing a program after ``TURNS`` turns and
registering a new one (so finished programs' state must be freed); every 10th program is
abandoned unfinished, as by a crashed client (its state stays until the program idle TTL,
``--program-idle-ttl-s``, here longer than the run: see ``IDLE_TTL_S``). Meanwhile one client
sends a 10 MB body every ~2 s (declared, then chunked: both must be refused with 413) and a
process of its own polls ``/health`` every 50 ms. In the second half of the run comes the
slow-client phase (``_soak_slow``): ``SLOW_CONNS`` idle partial connections (fewer if the
descriptor limit, raised soft to hard first, cannot hold them) beside the same load, reopened as
the gateway's header and body timeouts cut them off, and a new connection every 50 ms for
``/health``: ``slow_conns_held``, ``new_conn_failures`` (goal 0) and ``/health`` p99 during the
phase, on the poller's kept-alive connection (``slow_health_p99_ms``, goal <= 100 ms) and on new
ones (``new_conn_health_p99_ms``). The other ``/health`` figures leave that phase out.

Reported: requests, errors (a status other than 200, or an error event in a stream), resets
(a connection closed before any status), latency p50/p99, the gateway's RSS growth after
warm-up (the first third of the run) to the run's end (``rss_growth``: the slow phase ends a few
seconds before the load, so its connections are closed by then) and to the most while the
phase's connections were open (``rss_growth_slow_held``), the same for the anonymous part of the
RSS (``anon_rss_*``: the heap, which the host's reclaim of file pages leaves alone), and
``/health`` p99 while a 10 MB body was being refused; the baseline beside it is ``/health`` p99
at other times; from the gateway's ``/metrics``: programs ended by the idle TTL, engine requests
resent after a dropped kept-alive connection, engine calls retried, breaker openings, and the
p50/p99 of the gateway's event-loop lag over the run (``rollyard_gateway_loop_lag_seconds``: a
slow ``/health`` with a low loop lag is the host or the network, not work on the gateway's loop)
and its p99 in the slow phase (``slow_loop_lag_p99_ms``, the gateway's own view: the poller's
figure also holds its own wait for a CPU). The load average is recorded: on the shared 2-core
machine the engine, the gateway and this client share cores. So is the loop thread's own
scheduling (``/proc/PID/task/PID/schedstat``): its share of a core, and the share of the run it
spent runnable but waiting for a CPU (``loop_runq_wait``), with the host's CPU pressure (PSI)
beside it: a loop that waits for a CPU is late whatever its own work. The engine's session runs
at autogroup nice ``ENGINE_NICE`` (below): on a GPU host its compute is off the CPU.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import os
import random
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import httpx

from rollyard.bench._gateway_load import _pct
from rollyard.bench._procs import ADMIN, _engine, _gateway
from rollyard.bench._report import report
from rollyard.bench._soak_slow import RAMP_S, child_process, fitting_conns, raise_fd_limit, slow_phase
from rollyard.bench._soak_watch import (
    GatewayWatch,
    bucket_quantile,
    host_cpu_pressure_s,
    lag_buckets,
    schedstat,
)

PROGRAMS, CONCURRENCY, TURNS = 1000, 256, 3
ABANDON_EVERY = 10  # every 10th program of a client is never finished
# The gateway's --program-idle-ttl-s here. Programs registered up front wait idle for their
# client's turn (minutes at load 25: a 15 s TTL ended 751 of them, and their clients got 409),
# so the TTL is above the run's length: abandoned programs stay; tests/gateway/test_idle*.py
# show the TTL ending them.
IDLE_TTL_S = 300
# The engine's session's autogroup nice (``ROLLYARD_BENCH_SOAK_ENGINE_NICE``, default 10): on a GPU
# host the engine's compute runs on the GPU, here it runs on the two cores the gateway needs, so
# the engine yields them when the gateway is runnable. 0 reproduces the earlier runs.
ENGINE_NICE = 10
SLOW_CONNS = 3000  # idle partial connections of the slow-client phase (``_soak_slow``)
BIG = 10 * 1024 * 1024
_RESETS = (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)


def _poll_health(url: str, until: float, out: Connection) -> None:
    """Child process: (at, seconds) of each ``/health`` until ``until``, sent back on ``out``."""
    samples: list[tuple[float, float]] = []
    with httpx.Client(timeout=30) as c:
        while time.perf_counter() < until:
            t = time.perf_counter()
            c.get(f"{url}/health")
            samples.append((t, time.perf_counter() - t))
            time.sleep(0.05)
    out.send(samples)


def _gauges(url: str) -> dict[str, float]:
    """The gateway's own count of engine retries, resends and breaker openings."""
    text = httpx.get(f"{url}/metrics", headers={"x-api-key": ADMIN}).text
    names = {
        "engine_retries": "rollyard_gateway_engine_retries_total",
        "engine_resends": "rollyard_engine_resends{",
        "breaker_opens": "rollyard_engine_breaker_opens_total{",
        "programs_idle_ended": "rollyard_gateway_programs_idle_ended_total",
    }
    return {
        k: sum(float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith(prefix))
        for k, prefix in names.items()
    }


class Soak:
    def __init__(self, url: str, session: aiohttp.ClientSession, until: float) -> None:
        self.url, self.s, self.until = url, session, until
        self.lat: list[float] = []
        self.errors: dict[str, int] = {}
        self.resets = 0
        self.big_refused = 0
        self.big_windows: list[tuple[float, float]] = []
        self.health: list[tuple[float, float]] = []  # (at, seconds)
        self.keys: list[str] = []
        self.finished = 0
        self.abandoned = 0

    def error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    async def new_program(self) -> tuple[str, str]:
        body = {"sampling": {"temperature": 1.0, "max_tokens": 8}}
        async with self.s.post(f"{self.url}/programs", json=body, headers={"x-api-key": ADMIN}) as r:
            p = await r.json()
        return p["id"], p["api_key"]

    async def turn(self, key: str, msgs: list[dict[str, Any]], stream: bool) -> str | None:
        body = {"model": "tiny", "messages": msgs, "max_tokens": 8, "stream": stream}
        t = time.perf_counter()
        try:
            async with self.s.post(
                f"{self.url}/v1/chat/completions", json=body, headers={"x-api-key": key}
            ) as r:
                if r.status != 200:
                    self.error(f"status_{r.status}")
                    await r.read()
                    return None
                if not stream:
                    text = (await r.json())["choices"][0]["message"]["content"] or ""
                else:
                    text = ""
                    async for raw in r.content:
                        line = raw.decode().strip()
                        if not line.startswith("data: {"):
                            continue
                        data = json.loads(line[6:])
                        if "error" in data:
                            self.error("stream_error")
                            return None
                        for c in data.get("choices") or []:
                            text += c["delta"].get("content") or ""
        except _RESETS:
            self.resets += 1
            return None
        self.lat.append(time.perf_counter() - t)
        return text

    async def client(self, programs: list[tuple[str, str]]) -> None:
        n = 0
        while time.perf_counter() < self.until:
            pid, key = programs.pop(0) if programs else await self.new_program()
            msgs: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
            for t in range(TURNS):
                msgs.append({"role": "user", "content": f"step {t}: list {random.randrange(1000)}"})
                answer = await self.turn(key, msgs, stream=(n + t) % 2 == 1)
                if answer is None or time.perf_counter() >= self.until:
                    break
                msgs.append({"role": "assistant", "content": answer})
            n += 1
            if n % ABANDON_EVERY == 0:  # a crashed client: never finished (the idle TTL ends it)
                self.abandoned += 1
                continue
            async with self.s.post(
                f"{self.url}/programs/{pid}/finish", json={"status": "success"}, headers={"x-api-key": ADMIN}
            ) as r:
                self.finished += r.status == 200

    async def poll_health(self) -> None:
        """``/health`` every 50 ms from a process (and session) of its own: the 256 clients'
        event loop here would add its own lag to every sample (it did: p99 0.7 s with no big
        body in flight). perf_counter is CLOCK_MONOTONIC on Linux: the child's timestamps are
        comparable."""
        self.health = await child_process(_poll_health, self.url, self.until)

    async def send_big(self, key: str) -> None:
        blob = json.dumps({"messages": [{"role": "user", "content": "x" * BIG}]}).encode()

        async def chunks() -> Any:
            for i in range(0, len(blob), 1 << 16):
                yield blob[i : i + (1 << 16)]

        for i in itertools.count():
            if time.perf_counter() >= self.until:
                return
            t = time.perf_counter()
            data: Any = blob if i % 2 == 0 else chunks()
            try:
                async with (
                    aiohttp.ClientSession() as s,
                    s.post(
                        f"{self.url}/v1/chat/completions",
                        data=data,
                        headers={"x-api-key": key, "content-type": "application/json"},
                    ) as r,
                ):
                    await r.read()
                    self.big_refused += r.status == 413
            except _RESETS:  # the server may close before reading a declared oversized body
                self.big_refused += 1
            self.big_windows.append((t, time.perf_counter()))
            await asyncio.sleep(2.0)


async def _run(
    url: str, pid: int, seconds: float, programs: int, concurrency: int, slow_conns: int = 0
) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=concurrency + 16, keepalive_timeout=30.0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        soak = Soak(url, session, until=0.0)
        t = time.perf_counter()
        progs = [await soak.new_program() for _ in range(programs)]
        register_s = time.perf_counter() - t
        lag0 = await asyncio.to_thread(lag_buckets, url)
        sched0, psi0 = schedstat(pid), host_cpu_pressure_s()
        start = time.perf_counter()
        soak.until = start + seconds
        share = [progs[i::concurrency] for i in range(concurrency)]
        watch = GatewayWatch(url, pid, start)
        # The slow-client phase: the second half of the run, beside the same load, ending
        # SETTLE_S before the load does, so the last memory sample comes after its connections
        # closed (the run's open descriptors show they had).
        settle = max(1.0, seconds / 20)
        slow_window = (start + seconds / 2, soak.until - settle) if slow_conns else (math.inf, math.inf)
        phase = slow_phase(url, slow_conns, *slow_window) if slow_conns else asyncio.sleep(0, {})
        edges = (start, slow_window[0], slow_window[0] + RAMP_S, slow_window[1]) if slow_conns else ()
        *_, slow = await asyncio.gather(
            watch.mark(edges),
            *(soak.client(share[i]) for i in range(concurrency)),
            soak.poll_health(),
            soak.send_big(progs[0][1]),
            watch.sample_until(soak.until),
            phase,
        )
        wall = time.perf_counter() - start
        watch.sample()  # the load is over; the phase's connections closed SETTLE_S ago
        sched1, psi1 = schedstat(pid), host_cpu_pressure_s()
    ran_s, waited_s, slices = (b - a for a, b in zip(sched0, sched1, strict=True))
    gauges = await asyncio.to_thread(_gauges, url)
    lag = await asyncio.to_thread(lag_buckets, url)
    in_slow = [slow_window[0] + RAMP_S <= at <= slow_window[1] for at, _ in soak.health]
    big = [any(a <= at <= b for a, b in soak.big_windows) for at, _ in soak.health]
    during = [d for (_, d), b, s in zip(soak.health, big, in_slow, strict=True) if b and not s]
    other = [d for (_, d), b, s in zip(soak.health, big, in_slow, strict=True) if not b and not s]
    slow_health = [d for (_, d), s in zip(soak.health, in_slow, strict=True) if s]
    return {
        "requests": len(soak.lat),
        "errors": sum(soak.errors.values()),
        "errors_by_kind": soak.errors,
        "resets": soak.resets,
        "p50_ms": 1000 * statistics.median(soak.lat) if soak.lat else 0.0,
        "p99_ms": 1000 * _pct(soak.lat, 0.99) if soak.lat else 0.0,
        "req_per_s": len(soak.lat) / wall,
        # Memory after warm-up (the first third): at the end (the phase's connections closed)
        # and the most while they were open; the loop before and during the phase (_soak_watch).
        **watch.phase_figures(warm_from=seconds / 3),
        "rss_mb_series": watch.memory,
        "health_p99_ms_during_big": 1000 * _pct(during, 0.99) if during else 0.0,
        "health_p99_ms_other": 1000 * _pct(other, 0.99) if other else 0.0,
        "health_samples_during_big": len(during),
        # The slow-client phase (``_soak_slow``): /health on the poller's kept-alive connection.
        "slow_health_p99_ms": 1000 * _pct(slow_health, 0.99) if slow_health else 0.0,
        "slow_health_samples": len(slow_health),
        **slow,
        "big_bodies_refused": soak.big_refused,
        "big_bodies_sent": len(soak.big_windows),
        "programs_registered": programs,
        "programs_finished": soak.finished,
        "programs_abandoned": soak.abandoned,
        "register_s": register_s,
        "seconds": wall,
        "loop_lag_p50_ms": 1000 * bucket_quantile(lag0, lag, 0.5),
        "loop_lag_p99_ms": 1000 * bucket_quantile(lag0, lag, 0.99),
        "loop_lag_samples": lag.get(math.inf, 0.0) - lag0.get(math.inf, 0.0),
        # Whether a slow /health is the gateway's work or the host: the loop thread's share of a
        # core, its share of the run spent runnable but waiting for a CPU (the engine, this
        # client and the health poller share the cores), and that wait per scheduling.
        "loop_thread_cpu_share": ran_s / wall,
        "loop_thread_runq_wait_share": waited_s / wall,
        "loop_thread_runq_wait_ms_mean": 1000 * waited_s / slices if slices else 0.0,
        "host_cpu_pressure_share": (psi1 - psi0) / wall if psi0 is not None and psi1 is not None else None,
        **gauges,
    }


def main(quick: bool = False) -> dict[str, Any]:
    seconds = 20.0 if quick else 90.0
    programs, concurrency = (200, 64) if quick else (PROGRAMS, CONCURRENCY)
    load_before = os.getloadavg()
    ttl = ["--program-idle-ttl-s", str(IDLE_TTL_S)]
    fd_limit = raise_fd_limit()  # before the gateway starts: it inherits the limit
    slow = fitting_conns(SLOW_CONNS // (3 if quick else 1), reserve=2 * concurrency + 1024)
    nice = int(os.environ.get("ROLLYARD_BENCH_SOAK_ENGINE_NICE", ENGINE_NICE))
    with (
        _engine(autogroup_nice=nice) as (engine_url, model_dir),
        _gateway(engine_url, model_dir, ttl) as (url, pid),
    ):
        res = asyncio.run(_run(url, pid, seconds, programs, concurrency, slow))
    res["loadavg_before"], res["loadavg_after"] = load_before, os.getloadavg()
    res["engine_autogroup_nice"] = nice
    res["concurrency"], res["fd_limit"] = concurrency, fd_limit
    summary = {
        "requests": res["requests"],
        "errors": res["errors"],
        "resets": res["resets"],
        "p50_ms": res["p50_ms"],
        "p99_ms": res["p99_ms"],
        "rss_growth": res["rss_growth"],
        "rss_growth_slow_held": res["rss_growth_slow_held"],
        "anon_rss_growth": res["anon_rss_growth"],
        "anon_rss_growth_slow_held": res["anon_rss_growth_slow_held"],
        "health_p99_ms": res["health_p99_ms_during_big"],
        "health_p99_ms_other": res["health_p99_ms_other"],
        "slow_conns_held": res["slow_conns_held"],
        "new_conn_failures": res["new_conn_failures"],
        "slow_health_p99_ms": res["slow_health_p99_ms"],
        "new_conn_health_p99_ms": res["new_conn_health_p99_ms"],
        "slow_loop_lag_p99_ms": res.get("slow_loop_lag_p99_ms", 0.0),
        "loop_lag_p99_ms": res["loop_lag_p99_ms"],
        "loop_runq_wait": res["loop_thread_runq_wait_share"],
        "load1": res["loadavg_after"][0],
        "engine_nice": nice,
        "idle_ended": res["programs_idle_ended"],
        "engine_resends": res["engine_resends"],
        "engine_retries": res["engine_retries"],
    }
    return report("soak", summary, res)
