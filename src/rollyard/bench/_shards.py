"""Gateway shards beside one gateway: the gateway's CPU per request with ``--workers 2`` over
``--workers 1``, same canned engine, same requests (``shard2_cpu_ratio`` in ``rollyard bench
gateway``'s last line).

What it shows: sharding costs (almost) nothing per request, so N shards give about N times the
requests per core-second one gateway gives. The CPU counted is every process of the gateway's
tree (supervisor and shards); the client and the engine are not counted. Programs are created
through shard 0's admin API (a creation another shard owns is passed on once) and each program's
requests go to the shard its creation answer names, as agents' do; creations happen before the
CPU is counted (a program's creation is not one of its requests). Both layouts run side by side
for the whole measure, each warmed first; rounds alternate them (1, 2, 2, 1, ...); the ratio is
the median of per-round ratios.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp

from rollyard.bench._procs import ADMIN, _cpu_seconds, _healthy, _stop, _wait_until
from rollyard.core.net import free_ports

SAMPLING = {"temperature": 1.0, "max_tokens": 16}


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every live descendant (from /proc)."""
    parents: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                parents[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
    tree, frontier = {root}, [root]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parents.items() if pp == p and c not in tree]
        tree.update(kids)
        frontier += kids
    total = 0.0
    for pid in tree:
        with contextlib.suppress(OSError):
            total += _cpu_seconds(pid)
    return total


@contextlib.contextmanager
def sharded(engine_url: str, model_dir: Path, workers: int) -> Iterator[tuple[str, int]]:
    """``rollyard gateway --workers N``: (shard 0's url, the supervisor's pid)."""
    port = free_ports(workers)
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-m", "rollyard", "gateway", "--engine", engine_url, "--port", str(port)]
        cmd += ["--model-dir", str(model_dir), "--model-name", "tiny", "--state-dir", state]
        cmd += ["--capacity", "1024", "--workers", str(workers)]
        env = {**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        try:
            for k in range(workers):
                _wait_until(lambda k=k: _healthy(f"http://127.0.0.1:{port + k}"), f"gateway shard {k}")  # type: ignore[misc]
            yield f"http://127.0.0.1:{port}", proc.pid
        finally:
            _stop(proc)


async def _create(url: str, programs: int) -> list[dict[str, Any]]:
    made = []
    async with aiohttp.ClientSession() as http:
        for _ in range(programs):
            body, headers = {"sampling": SAMPLING}, {"x-api-key": ADMIN}
            async with http.post(f"{url}/programs", json=body, headers=headers) as r:
                r.raise_for_status()
                made.append(await r.json())
    return made


async def _drive(made: list[dict[str, Any]], requests: int) -> tuple[int, float]:
    """``requests`` chats among the programs ``made``, one closed-loop worker each; the requests
    answered and the seconds it took."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        todo = iter(range(requests))
        done = 0

        async def worker(p: dict[str, Any]) -> None:
            nonlocal done
            for n in todo:
                body = {"model": "tiny", "messages": [{"role": "user", "content": f"request {n}"}]}
                headers = {"Authorization": f"Bearer {p['api_key']}"}
                async with http.post(
                    p["base_urls"]["openai"] + "/chat/completions", json=body, headers=headers
                ) as r:
                    r.raise_for_status()
                    await r.read()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(p) for p in made))
        return done, time.perf_counter() - t0


def shard_cpu(
    engine_url: str, model_dir: Path, rounds: int = 3, programs: int = 64, requests: int = 640
) -> dict[str, Any]:
    """CPU per request of one gateway and of two shards, in alternating rounds; their ratio.

    Both layouts run side by side for the whole measure, each warmed first (two blocks: first
    renders, then the processes' and the engine's own warm-up), so a round compares the two
    against the same engine at the same moment. Started afresh per round (as this was), the one
    gateway came out cheaper round after round as the engine warmed and the shards did not
    (0.62 -> 0.45 ms against 0.59 -> 0.57): the ratio measured the engine's warming too."""
    per: dict[int, list[float]] = {1: [], 2: []}
    ratios = []
    with contextlib.ExitStack() as stack:
        trees = {w: stack.enter_context(sharded(engine_url, model_dir, w)) for w in (1, 2)}
        made = {w: asyncio.run(_create(url, programs)) for w, (url, _) in trees.items()}
        for warm in (programs, requests // 2):  # creations and warm-up are not counted
            for w in (1, 2):
                asyncio.run(_drive(made[w], warm))
        for r in range(rounds):
            got: dict[int, float] = {}
            for w in (1, 2) if r % 2 == 0 else (2, 1):
                pid = trees[w][1]
                c0 = tree_cpu_seconds(pid)
                n, _ = asyncio.run(_drive(made[w], requests))
                got[w] = 1000 * (tree_cpu_seconds(pid) - c0) / n
                per[w].append(got[w])
            ratios.append(got[2] / got[1])
    return {
        "cpu_ms_per_req_1": statistics.median(per[1]),
        "cpu_ms_per_req_2": statistics.median(per[2]),
        "shard2_cpu_ratio": statistics.median(ratios),
        "rounds": ratios,
    }
