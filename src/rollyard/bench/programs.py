"""``rollyard bench programs``: KV-oversubscribed multi-turn agents, straight to vLLM and
through the gateway under ``fifo``, ``thunder`` and ``rollyard``.

Each program is an agent loop over the official OpenAI SDK: a model call, a "tool" that
sleeps 0.5-2 s, its output appended, again, for ``TURNS`` turns; half the programs start
with a long prompt, half with a short one. The engine's KV cache (``--kv-tokens``) is far
below the sum of the programs' contexts, so without program-aware admission vLLM preempts
and recomputes. Paths run in alternating order in each round (outside load lands on all),
every prompt carries its round and path so no path hits another's prefix cache.

Reported (medians over rounds): ``thr_vs_vllm`` = rollyard turns/min over direct,
``thr_vs_thunder`` = rollyard over thunder, vLLM preemptions during the direct and the
rollyard path, ``long_short_ttft`` = the median first-response time of long-prompt programs
over that of short-prompt ones (rollyard; thunder's in the details), ``hold_p99_s`` (the
gateway's hold-time histogram, upper bucket bound) and the prefix-cache ``hit_rate`` under
rollyard. A request that waits past ``ROLLYARD_BENCH_TIMEOUT_S`` (300 s) ends its program (counted
in ``timed_out``; its turns so far count). One engine only: two engines on two shared cores
measure contention, not routing. ``ROLLYARD_BENCH_PROGRAMS``, ``_TURNS``, ``_ROUNDS`` and
``_KV_TOKENS`` size the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from rollyard.bench._report import report
from rollyard.bench.gateway import _engine
from rollyard.core.net import free_port

ADMIN = "bench-admin"
PATHS = ("direct", "fifo", "thunder", "rollyard")
TIMEOUT_S = float(os.environ.get("ROLLYARD_BENCH_TIMEOUT_S", 300))
WORDS = ["module", "class", "import", "return", "value", "config", "parser", "buffer", "engine", "token"]


@contextlib.contextmanager
def _gateway(engine_url: str, model_dir: Path, policy: str) -> Iterator[str]:
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-m", "rollyard", "gateway", "--engine", engine_url, "--policy", policy]
        cmd += [
            "--model-dir",
            str(model_dir),
            "--port",
            str(port),
            "--state-dir",
            state,
            "--model-name",
            "tiny",
        ]
        proc = subprocess.Popen(
            cmd, env={**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}, stdout=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(600):
                with contextlib.suppress(httpx.HTTPError):
                    if httpx.get(f"{url}/health").status_code == 200:
                        break
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:  # requests still held (a starved program) keep it up
                proc.kill()
                proc.wait(30)


def _words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


async def _program(base: str, key: str, tag: str, long: bool, turns: int, seed: int) -> dict[str, Any]:
    import openai

    rng = random.Random(seed)
    api = openai.AsyncOpenAI(base_url=base, api_key=key, max_retries=0, timeout=TIMEOUT_S)
    msgs: list[dict[str, str]] = [{"role": "user", "content": f"{tag}: " + _words(rng, 400 if long else 50)}]
    first = 0.0
    done = 0
    try:
        for k in range(turns):
            t0 = time.perf_counter()
            try:
                r = await api.chat.completions.create(
                    model="tiny", messages=msgs, max_tokens=32, temperature=1.0
                )
            except openai.APITimeoutError:  # starved past the client's patience: counted, not fatal
                return {"long": long, "first_s": first or TIMEOUT_S, "turns": done, "timed_out": True}
            if k == 0:
                first = time.perf_counter() - t0
            done += 1
            msgs.append({"role": "assistant", "content": r.choices[0].message.content or ""})
            await asyncio.sleep(rng.uniform(0.5, 2.0))  # the tool runs
            msgs.append({"role": "user", "content": f"tool {k}: " + _words(rng, rng.randint(30, 90))})
    finally:
        await api.close()
    return {"long": long, "first_s": first, "turns": done, "timed_out": False}


async def _engine_counts(url: str) -> tuple[int, int, int]:
    from rollyard.engines.vllm import VLLMBackend

    b = VLLMBackend(url)
    try:
        s = await b.stats()
    finally:
        await b.aclose()
    return s.preemptions, s.prefix_cache_hits, s.prefix_cache_queries


def _hold_p99(metrics_text: str) -> float:
    """Upper bound of the bucket holding the 99th percentile of ``rollyard_sched_hold_seconds``."""
    buckets: list[tuple[float, float]] = []
    for line in metrics_text.splitlines():
        if line.startswith("rollyard_sched_hold_seconds_bucket"):
            le = line.split('le="')[1].split('"')[0]
            buckets.append((float("inf") if le == "+Inf" else float(le), float(line.split()[-1])))
    if not buckets or buckets[-1][1] == 0:
        return 0.0
    total = buckets[-1][1]
    return next(le for le, n in buckets if n >= 0.99 * total)


async def _run_path(
    path: str, engine_url: str, gateway_url: str | None, n: int, turns: int, tag: str
) -> dict[str, Any]:
    pre = await _engine_counts(engine_url)
    keys: list[tuple[str, str]] = []
    async with httpx.AsyncClient() as http:
        for _ in range(n):
            if gateway_url is None:
                keys.append((f"{engine_url}/v1", "none"))
                continue
            r = await http.post(f"{gateway_url}/programs", json={}, headers={"x-api-key": ADMIN})
            r.raise_for_status()
            keys.append((f"{gateway_url}/v1", r.json()["api_key"]))
    t0 = time.perf_counter()
    progs = await asyncio.gather(
        *(
            _program(b, k, f"{tag} {path} p{i}", i % 2 == 0, turns, zlib.crc32(f"{tag} {i}".encode()))
            for i, (b, k) in enumerate(keys)
        )
    )
    wall = time.perf_counter() - t0
    post = await _engine_counts(engine_url)
    hold = 0.0
    if gateway_url is not None:
        hold = _hold_p99(httpx.get(f"{gateway_url}/metrics").text)
    firsts = {flag: [p["first_s"] for p in progs if p["long"] is flag] for flag in (True, False)}
    queries = post[2] - pre[2]
    return {
        "turns_per_min": 60 * sum(p["turns"] for p in progs) / wall,
        "wall_s": wall,
        "preemptions": post[0] - pre[0],
        "hit_rate": (post[1] - pre[1]) / queries if queries else 0.0,
        "long_short_ttft": statistics.median(firsts[True]) / max(1e-9, statistics.median(firsts[False])),
        "ttft_long_s": statistics.median(firsts[True]),
        "ttft_short_s": statistics.median(firsts[False]),
        "hold_p99_s": hold,
        "timed_out": sum(p["timed_out"] for p in progs),
        "loadavg": Path("/proc/loadavg").read_text().split()[:3],
    }


def main(quick: bool = False) -> None:
    env = os.environ.get
    n, turns, rounds = (8, 3, 1) if quick else (int(env("ROLLYARD_BENCH_PROGRAMS", 24)), 6, 2)
    turns, rounds = int(env("ROLLYARD_BENCH_TURNS", turns)), int(env("ROLLYARD_BENCH_ROUNDS", rounds))
    kv_tokens = int(os.environ.get("ROLLYARD_BENCH_KV_TOKENS", 8192))
    per_path: dict[str, list[dict[str, Any]]] = {p: [] for p in PATHS}
    with _engine(kv_tokens) as (engine_url, model_dir):
        for r in range(rounds):
            order = PATHS if r % 2 == 0 else tuple(reversed(PATHS))
            for path in order:
                tag = f"round{r}"
                if path == "direct":
                    res = asyncio.run(_run_path(path, engine_url, None, n, turns, tag))
                else:
                    with _gateway(engine_url, model_dir, path) as gw:
                        res = asyncio.run(_run_path(path, engine_url, gw, n, turns, tag))
                per_path[path].append(res)
                print(f"round {r} {path}: {res}", flush=True)

    def med(path: str, key: str) -> float:
        return statistics.median(x[key] for x in per_path[path])

    summary = {
        "thr_vs_vllm": med("rollyard", "turns_per_min") / med("direct", "turns_per_min"),
        "thr_vs_thunder": med("rollyard", "turns_per_min") / med("thunder", "turns_per_min"),
        "preempt_vllm": int(med("direct", "preemptions")),
        "preempt_ours": int(med("rollyard", "preemptions")),
        "long_short_ttft": med("rollyard", "long_short_ttft"),
        "hold_p99_s": med("rollyard", "hold_p99_s"),
        "hit_rate": med("rollyard", "hit_rate"),
    }
    details = {
        "programs": n,
        "turns": turns,
        "rounds": rounds,
        "kv_tokens": kv_tokens,
        "model": "tiny",
        "per_path": per_path,
        "timeout_s": TIMEOUT_S,
        "medians": {
            p: {k: med(p, k) for k in ("turns_per_min", "preemptions", "long_short_ttft", "hit_rate")}
            for p in PATHS
        },
    }
    report("programs", summary, details)
