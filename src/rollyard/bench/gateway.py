"""``rollyard bench gateway``: the same chat load sent straight to vLLM and through the gateway.

Each request is a fresh single-turn chat with greedy decoding and a fixed token budget, so
both paths do identical engine work (the gateway renders the same ids vLLM's template does).
Reported: throughput ratio at 64 concurrent programs, latency added by the gateway (p50/p99
of gateway minus direct, same concurrency), the gateway process's CPU time per request, and a
1000-open-program run. Engine and gateway share this machine's cores.

Env: ``ROLLYARD_BENCH_ENGINE_URL`` + ``ROLLYARD_BENCH_MODEL_DIR`` reuse a running vLLM.
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

import httpx

from rollyard.bench._report import report

ADMIN = "bench-admin"
MAX_TOKENS = 32


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _engine() -> Iterator[tuple[str, Path]]:
    url, model = os.environ.get("ROLLYARD_BENCH_ENGINE_URL"), os.environ.get("ROLLYARD_BENCH_MODEL_DIR")
    if url and model:
        yield url, Path(model)
        return
    from rollyard.engines.launcher import VLLMServer
    from rollyard.engines.tiny_model import create_model

    with tempfile.TemporaryDirectory() as d:
        model_dir = create_model(Path(d) / "tiny", seed=0, size="tiny")
        with VLLMServer(model_dir, kv_tokens=16384, max_model_len=2048, served_name="tiny") as server:
            yield server.url, model_dir


@contextlib.contextmanager
def _gateway(engine_url: str, model_dir: Path) -> Iterator[tuple[str, int]]:
    from rollyard.engines.launcher import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        cmd = [
            sys.executable,
            "-m",
            "rollyard",
            "gateway",
            "--engine",
            engine_url,
            "--model-dir",
            str(model_dir),
        ]
        cmd += ["--port", str(port), "--state-dir", state, "--model-name", "tiny", "--capacity", "1024"]
        env = {**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(300):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health").status_code == 200:
                        break
                time.sleep(0.1)
            yield url, proc.pid
        finally:
            proc.terminate()
            proc.wait(15)


async def _load(
    client: httpx.AsyncClient, url: str, keys: list[str], requests: int, concurrency: int, tag: str
) -> dict[str, Any]:
    """``requests`` chats from ``concurrency`` workers; worker i uses keys[i % len(keys)] in turn."""
    latencies: list[float] = []
    tokens = 0
    counter = iter(range(requests))

    async def worker(w: int) -> None:
        nonlocal tokens
        for n in counter:
            key = keys[n % len(keys)]
            body = {
                "model": "tiny",
                "messages": [{"role": "user", "content": f"{tag} request {n}: write some code"}],
                "max_tokens": MAX_TOKENS,
                "temperature": 0.0,
            }
            t0 = time.perf_counter()
            r = await client.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
            latencies.append(time.perf_counter() - t0)
            r.raise_for_status()
            tokens += r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    wall = time.perf_counter() - t0
    lat = sorted(latencies)
    return {
        "req_per_s": requests / wall,
        "tok_per_s": tokens / wall,
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "requests": requests,
    }


async def _programs(client: httpx.AsyncClient, url: str, n: int) -> list[str]:
    keys = []
    for _ in range(n):
        body = {"sampling": {"temperature": 0.0, "max_tokens": MAX_TOKENS}}
        r = await client.post(f"{url}/programs", json=body, headers={"x-api-key": ADMIN})
        r.raise_for_status()
        keys.append(r.json()["api_key"])
    return keys


async def _run(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    levels = [1, 16, 64]
    per_level = {1: 8, 16: 64, 64: 128} if quick else {1: 24, 16: 192, 64: 512}
    details: dict[str, Any] = {}
    limits = httpx.Limits(max_connections=2048, max_keepalive_connections=2048)
    with _engine() as (engine_url, model_dir), _gateway(engine_url, model_dir) as (gw_url, gw_pid):
        async with httpx.AsyncClient(timeout=600, limits=limits) as client:
            keys = await _programs(client, gw_url, 64)
            await _load(client, engine_url, ["x"], 8, 8, "warm")  # warm both paths
            await _load(client, gw_url, keys, 8, 8, "warm")
            cpu_s, gw_requests = 0.0, 0
            for c in levels:
                n = per_level[c]
                direct = await _load(client, engine_url, ["x"], n, c, f"c{c}")
                cpu0 = _cpu_seconds(gw_pid)
                via = await _load(client, gw_url, keys[:c], n, c, f"c{c}")
                cpu_s += _cpu_seconds(gw_pid) - cpu0
                gw_requests += n
                details[f"c{c}"] = {"direct": direct, "gateway": via}
            n_open = 200 if quick else 1000
            t0 = time.perf_counter()
            open_keys = await _programs(client, gw_url, n_open)
            create_s = time.perf_counter() - t0
            many = await _load(client, gw_url, open_keys, n_open, 64, "open")
            details["open_programs"] = {"programs": n_open, "create_s": create_s, "gateway": many}
    c64 = details["c64"]
    summary = {
        "thr_ratio_64": c64["gateway"]["tok_per_s"] / c64["direct"]["tok_per_s"],
        "p50_added_ms": c64["gateway"]["p50_ms"] - c64["direct"]["p50_ms"],
        "p99_added_ms": c64["gateway"]["p99_ms"] - c64["direct"]["p99_ms"],
        "cpu_ms_per_req": 1000 * cpu_s / gw_requests,
    }
    return summary, details


def main(quick: bool = False) -> dict[str, Any]:
    summary, details = asyncio.run(_run(quick))
    details["quick"] = quick
    return report("gateway", summary, details)
