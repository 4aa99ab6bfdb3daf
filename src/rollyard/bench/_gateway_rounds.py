"""The gateway bench's paired CPU measures: paths measured in blocks whose order rotates round by
round, so drift in the shared cores' speed lands on every path, and ratios taken per round, then
the median over rounds (``cpu_ratio_64``, ``stream_cpu_vs_floor_64``).
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from rollyard.bench._gateway_load import Workload, _acc, _block, _post
from rollyard.bench._procs import _cpu_seconds


async def rotating_rounds(
    names: list[str], rounds: int, measure: Callable[[str], Awaitable[float]]
) -> dict[str, list[float]]:
    """``measure(name)`` of every name once a round, the names' order rotating each round (two
    names alternate: a, b, b, a, ...)."""
    per: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            per[name].append(await measure(name))
    return per


def median_ratio(per: dict[str, list[float]], a: str, b: str) -> float:
    """The median over rounds of ``a``'s figure over ``b``'s."""
    return statistics.median(x / y for x, y in zip(per[a], per[b], strict=True))


def _medians(per: dict[str, list[float]], n: int) -> dict[str, Any]:
    return {
        "requests_per_block": n,
        "cpu_ms_per_req": per,
        "median_cpu_ms_per_req": {name: statistics.median(v) for name, v in per.items()},
    }


async def _stream_level(
    session: aiohttp.ClientSession,
    work: Workload,
    via: tuple[str, int],
    keys: list[str],
    c: int,
    n: int,
    relay: bool = False,
) -> dict[str, Any]:
    """The same chat requests streamed, ``c`` at a time, through ``via`` (url, pid): its CPU per
    request (every token its own event from the engine and to the client) and the events it
    sent. With ``relay`` it is the floor proxy, sent the engine bodies the gateway would send."""
    url, pid = via
    bodies = {i: await work.direct(i, stream=True) for i in range(n)} if relay else {}

    async def streamed(s: aiohttp.ClientSession, i: int, w: int) -> tuple[int, dict[str, float]]:
        if relay:
            target, body, headers = f"{url}/v1/completions", bodies[i], {}
        else:
            target, body = f"{url}/v1/chat/completions", {**work.chat(i), "stream": True}
            headers = {"Authorization": f"Bearer {keys[w % len(keys)]}"}
        events = 0
        async with s.post(target, json=body, headers=headers) as r:
            r.raise_for_status()
            async for line in r.content:
                events += line.startswith(b"data: {")
        return events, {}

    acc, cpu0 = _acc(), _cpu_seconds(pid)
    await _block(session, streamed, list(range(n)), c, acc)
    cpu = _cpu_seconds(pid) - cpu0
    return {
        "requests": n,
        "events": acc["tokens"],  # what _block counts is what ``streamed`` returns: events
        "wall_s": acc["wall"],
        "gateway_cpu_ms_per_req": 1000 * cpu / n,
        "load1": os.getloadavg()[0],
    }


async def _stream_rounds(
    session: aiohttp.ClientSession,
    work: Workload,
    gateway: tuple[str, int],
    relay: tuple[str, int],
    keys: list[str],
    c: int,
    n: int,
    rounds: int,
) -> dict[str, Any]:
    """The gateway's and the relay's CPU per streamed request, in blocks of ``n`` at ``c``
    programs whose order alternates each round; the ratio is the median of per-round ratios.

    Measured as one block each, minutes apart, the relay's own figure moved 1.18 -> 1.31 ms
    between two quiet runs, all of it in the ratio (drift in the shared cores' speed); paired
    rounds keep that out of it."""

    async def measure(name: str) -> float:
        relayed = name == "relay"
        block = await _stream_level(session, work, relay if relayed else gateway, keys, c, n, relayed)
        return float(block["gateway_cpu_ms_per_req"])

    per = await rotating_rounds(["gateway", "relay"], rounds, measure)
    return {
        **_medians(per, n),
        "gateway_vs_relay": median_ratio(per, "gateway", "relay"),
        "load1": os.getloadavg()[0],
    }


async def _cpu_rounds(
    session: aiohttp.ClientSession,
    work: Workload,
    paths: dict[str, tuple[str, int, bool]],
    keys: list[str],
    c: int,
    n: int,
    rounds: int,
) -> dict[str, Any]:
    """Each path's CPU per request at ``c`` programs: a block of ``n`` requests per path per
    round, the paths' order rotating, so drift in the shared cores' speed lands on every path
    (measured one after another, one run's gateway/relay ratio moved 2.5x -> 4.3x between runs).

    ``paths``: name -> (url, pid, chats): ``chats`` paths get the gateway's chat requests and
    keys, the others the engine bodies the gateway would send. Ratios are per round, then the
    median over rounds."""
    bodies = {i: await work.direct(i) for i in range(n)}

    async def measure(name: str) -> float:
        url, pid, chats = paths[name]

        async def send(s: aiohttp.ClientSession, i: int, w: int) -> tuple[int, dict[str, float]]:
            if chats:
                return await _post(s, f"{url}/v1/chat/completions", work.chat(i), keys[w % len(keys)])
            return await _post(s, f"{url}/v1/completions", bodies[i], None)

        cpu0 = _cpu_seconds(pid)
        await _block(session, send, list(range(n)), c, _acc())
        return 1000 * (_cpu_seconds(pid) - cpu0) / n

    per = await rotating_rounds(list(paths), rounds, measure)
    return {
        **_medians(per, n),
        "gateway_vs_relay": median_ratio(per, "gateway", "relay"),
        "required_vs_relay": median_ratio(per, "required", "relay"),
        "gateway_vs_required": median_ratio(per, "gateway", "required"),
        "load1": os.getloadavg()[0],
    }
