"""The soak's slow-client phase: thousands of idle partial connections beside the normal load.

``n`` connections, from loopback source addresses 127.0.0.2 and up (one address may hold at most
1,024 connections, ``--max-conns-per-peer``; the normal load comes from 127.0.0.1), each send a
partial request and stall: nothing at all, headers without their end, or full headers and a part
of the declared body, in turn. The gateway's header and body timeouts close them; each one closed
is reopened, so the population stays for the whole phase (``held``: how many were open, sampled
every 0.5 s). Meanwhile a prober opens a new connection every 50 ms (whether or not the one
before was answered) and asks ``/health`` on it (``Connection: close``): one that cannot be
opened or answered 200 within 5 s is a ``new_conn_failure``, the failure mode of issue 45
(descriptors exhausted: new connections reset).
Holder and prober run in processes (spawn) and sessions of their own, as the soak's ``/health``
poller does, so their sockets are not the soak clients' event loop's work and their CPU is not
taken from the poller's share (``child_process``).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import random
import resource
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

import uvloop

PER_SOURCE = 750  # slow connections per source address, below the gateway's 1,024 per peer
RAMP_S = 3.0  # the connections open spread over this long, not as one SYN burst
_STALLS = (
    b"",
    b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\n",
    b'POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-length: 4096\r\n\r\n{"messages": [',
)
PROBE_EVERY_S, PROBE_TIMEOUT_S = 0.05, 5.0
_PROBE = b"GET /health HTTP/1.1\r\nhost: soak\r\nconnection: close\r\n\r\n"


def raise_fd_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard one (children and the gateway inherit it); the new soft."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def fitting_conns(wanted: int, reserve: int) -> int:
    """``wanted`` slow connections, fewer if the descriptor limit (one each here and one each in
    the gateway, both under this limit) minus ``reserve`` for everything else cannot hold them."""
    return max(0, min(wanted, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - reserve))


async def _hold(host: str, port: int, n: int, start: float, until: float) -> dict[str, Any]:
    state = {"open": 0, "closed_by_server": 0, "open_failures": 0}
    held: list[tuple[float, int]] = []

    async def one(i: int) -> None:
        source = f"127.0.0.{2 + i // PER_SOURCE}"
        await asyncio.sleep(max(0.0, start + RAMP_S * i / n - time.perf_counter()))
        while time.perf_counter() < until:
            try:
                reader, writer = await asyncio.open_connection(host, port, local_addr=(source, 0))
            except OSError:
                state["open_failures"] += 1
                await asyncio.sleep(0.5)
                continue
            state["open"] += 1
            try:
                if stall := _STALLS[i % len(_STALLS)]:
                    writer.write(stall)
                with contextlib.suppress(TimeoutError):
                    # The server closing the connection (EOF or reset) ends the wait.
                    with contextlib.suppress(OSError):
                        await asyncio.wait_for(reader.read(), until - time.perf_counter())
                    if time.perf_counter() < until:
                        state["closed_by_server"] += 1
            finally:
                state["open"] -= 1
                writer.transport.abort()
            await asyncio.sleep(random.uniform(0.0, 0.5))  # reconnect, not all in one burst

    async def sample() -> None:
        while time.perf_counter() < until:
            held.append((time.perf_counter(), state["open"]))
            await asyncio.sleep(0.5)

    await asyncio.gather(*(one(i) for i in range(n)), sample())
    return {**state, "held": held}


def _holder(host: str, port: int, n: int, start: float, until: float, out: Connection) -> None:
    # uvloop: the holder's own CPU comes out of the same two cores as the gateway's
    res = uvloop.run(_hold(host, port, n, start, until))
    usage = resource.getrusage(resource.RUSAGE_SELF)
    out.send({**res, "cpu_s": usage.ru_utime + usage.ru_stime})


async def _probe(host: str, port: int) -> tuple[float, float, bool]:
    t, got = time.perf_counter(), b""
    with contextlib.suppress(OSError, TimeoutError):
        async with asyncio.timeout(PROBE_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(_PROBE)
                got = await reader.read()  # to the end: the probe asks for connection: close
            finally:
                writer.transport.abort()
    return t, time.perf_counter() - t, got.startswith(b"HTTP/1.1 200")


async def _probe_every(host: str, port: int, start: float, until: float) -> list[tuple[float, float, bool]]:
    await asyncio.sleep(max(0.0, start - time.perf_counter()))
    probes = []
    while time.perf_counter() < until:
        probes.append(asyncio.create_task(_probe(host, port)))
        await asyncio.sleep(PROBE_EVERY_S)
    return list(await asyncio.gather(*probes))


def _prober(host: str, port: int, start: float, until: float, out: Connection) -> None:
    """(at, seconds, ok) of a ``/health`` on a new connection opened every 50 ms, each not
    waiting for the one before (a slow answer does not thin out the probes)."""
    out.send(uvloop.run(_probe_every(host, port, start, until)))


def _own_session(target: Any, *args: Any) -> None:
    os.setsid()
    target(*args)


async def child_process(target: Any, *args: Any) -> Any:
    """``target(*args, out)`` in a spawned process of its own session; what it sends on ``out``.

    Its own session: with the kernel's autogroup scheduling (``_procs``), CPU time is shared
    between sessions first, so each client process here is scheduled as a separate client host
    would be, not out of one slice with the soak's clients (a ``/health`` poller sharing a slice
    with the slow-connection holder waited for a CPU whenever the holder was busy)."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_own_session, args=(target, *args, child), daemon=True)
    proc.start()
    child.close()
    try:
        return await asyncio.to_thread(parent.recv)
    finally:
        await asyncio.to_thread(proc.join, 10)


def _p99_ms(values: list[float]) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


async def slow_phase(url: str, n: int, start: float, until: float) -> dict[str, Any]:
    """Hold ``n`` slow connections to the gateway at ``url`` from ``start`` to ``until``
    (``perf_counter`` times) and probe new connections meanwhile; the phase's figures."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    held, probes = await asyncio.gather(
        child_process(_holder, host, int(port), n, start, until),
        child_process(_prober, host, int(port), start + RAMP_S, until),
    )
    steady = [k for at, k in held["held"] if at >= start + RAMP_S + 1.0] or [0]
    failed = [p for p in probes if not p[2]]
    return {
        "slow_conns_target": n,
        "slow_conns_held": statistics.median(steady),
        "slow_conns_held_min": min(steady),
        "slow_closed_by_gateway": held["closed_by_server"],
        "slow_open_failures": held["open_failures"],
        # the holder's own CPU: on the shared 2-core host the slow clients take it from the rest
        "slow_holder_cpu_share": held["cpu_s"] / max(until - start, 1e-9),
        "new_conn_probes": len(probes),
        "new_conn_failures": len(failed),
        "new_conn_health_p99_ms": _p99_ms([d for _, d, ok in probes if ok]),
    }
