"""``rollyard bench gateway``: the same requests sent straight to vLLM and through the gateway.

Fair by construction: the direct path posts the exact ``/v1/completions`` body the gateway
sends (token-id prompt rendered by the gateway's renderer, ``logprobs``, ``return_token_ids``,
the program's sampling, built by ``VLLMBackend.completion_body``), and the bench checks once
that the gateway's recorded turn has the same prompt ids and sampling. Both paths use the
same aiohttp client and the same prompts (shorter than one KV block, so no prefix-cache hits).

The two paths run in alternating blocks (direct, gateway, gateway, direct, ...) at each
concurrency, so other load on the shared cores lands on both. Reported: token throughput
ratio at 64 concurrent programs, latency added at the same concurrency (p50/p99 of gateway
minus direct), the gateway process's CPU time per request, and an all-at-once run of 1000
open programs. Engine and gateway share this machine's cores.

Env: ``ROLLYARD_BENCH_ENGINE_URL`` + ``ROLLYARD_BENCH_MODEL_DIR`` reuse a running vLLM (served
as ``tiny``).
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
import httpx

from rollyard.bench._report import report

ADMIN = "bench-admin"
MAX_TOKENS = 32
# Temperature 1 (what RL rollouts use): the random tiny model, decoded greedily, often emits eos
# first, which would turn the bench into a 1-token prefill test.
SAMPLING = {"temperature": 1.0, "max_tokens": MAX_TOKENS}


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
        cmd = [sys.executable, "-m", "rollyard", "gateway", "--engine", engine_url]
        cmd += ["--model-dir", str(model_dir), "--port", str(port), "--state-dir", state]
        cmd += ["--model-name", "tiny", "--capacity", "1024"]
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


class Workload:
    """Request n as a chat (gateway) and as the identical engine body (direct)."""

    def __init__(self, engine_url: str, model_dir: Path) -> None:
        from rollyard.core.program import Program, SamplingPolicy
        from rollyard.engines.vllm import VLLMBackend
        from rollyard.gateway.renderer import Renderer
        from rollyard.gateway.tokenizer import FastTokenizer

        self.renderer = Renderer(FastTokenizer(model_dir))
        self.backend = VLLMBackend(engine_url)
        self.program = Program(sampling=SamplingPolicy(**SAMPLING))

    @staticmethod
    def text(n: int) -> str:
        return f"request {n}: write some code"

    def chat(self, n: int) -> dict[str, Any]:
        return {
            "model": "tiny",
            "messages": [{"role": "user", "content": self.text(n)}],
            "max_tokens": MAX_TOKENS,
            "temperature": SAMPLING["temperature"],
        }

    async def direct(self, n: int) -> dict[str, Any]:
        from rollyard.gateway.routes_openai_chat import ChatCompletionBody, to_request
        from rollyard.gateway.sampling import context_limit, sampling_for

        request = to_request(ChatCompletionBody(**self.chat(n)))
        ids = self.renderer.render_fresh(request)
        await self.backend.model_name()
        limit = context_limit(self.program, self.backend.max_model_len)
        params = sampling_for(request, self.program, len(ids), limit)
        return await self.backend.completion_body(ids, params)


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str | None) -> int:
    """POST, return completion tokens (raises on an error status)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(url, json=body, headers=headers) as r:
        data = await r.json()
        r.raise_for_status()
    return int(data["usage"]["completion_tokens"])


async def _block(
    session: aiohttp.ClientSession, send: Any, ns: list[int], concurrency: int, acc: dict[str, Any]
) -> None:
    """Send requests ``ns`` from ``concurrency`` closed-loop workers; accumulate into ``acc``."""
    todo = iter(ns)

    async def worker(w: int) -> None:
        for n in todo:
            t0 = time.perf_counter()
            got = await send(session, n, w)  # not `acc[...] += await ...`: that reads before awaiting
            acc["tokens"] += got
            acc["lat"].append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    acc["wall"] += time.perf_counter() - t0


def _stats(acc: dict[str, Any]) -> dict[str, Any]:
    lat = sorted(acc["lat"])
    return {
        "requests": len(lat),
        "req_per_s": len(lat) / acc["wall"],
        "tokens_per_req": acc["tokens"] / len(lat),
        "tok_per_s": acc["tokens"] / acc["wall"],
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
    }


async def _programs(session: aiohttp.ClientSession, url: str, n: int) -> tuple[list[str], list[str]]:
    ids, keys = [], []
    for _ in range(n):
        async with session.post(
            f"{url}/programs", json={"sampling": SAMPLING}, headers={"x-api-key": ADMIN}
        ) as r:
            r.raise_for_status()
            p = await r.json()
        ids.append(p["id"])
        keys.append(p["api_key"])
    return ids, keys


async def _check_same_request(
    session: aiohttp.ClientSession, work: Workload, gw_url: str, pid: str, key: str
) -> None:
    """The gateway's recorded turn must carry the prompt ids and sampling the direct body has."""
    await _post(session, f"{gw_url}/v1/chat/completions", work.chat(0), key)
    async with session.get(f"{gw_url}/programs/{pid}/trajectory", headers={"x-api-key": ADMIN}) as r:
        turn = (await r.json())["segments"][0]["turns"][0]
    body = await work.direct(0)
    sampling = turn["sampling"]
    same = turn["prompt_ids"] == body["prompt"] and all(
        sampling[k] == body[k] for k in ("max_tokens", "temperature", "top_p", "top_k")
    )
    if not same:
        raise RuntimeError(f"direct body differs from the gateway's request: {turn} vs {body}")


async def _level(
    session: aiohttp.ClientSession,
    work: Workload,
    urls: tuple[str, str, int],
    keys: list[str],
    c: int,
    n: int,
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """Direct and gateway in alternating blocks; returns their stats and gateway CPU seconds."""
    engine_url, gw_url, gw_pid = urls
    bodies = {i: await work.direct(i) for i in range(n)}

    async def direct(s: aiohttp.ClientSession, i: int, w: int) -> int:
        return await _post(s, f"{engine_url}/v1/completions", bodies[i], None)

    async def via(s: aiohttp.ClientSession, i: int, w: int) -> int:
        return await _post(s, f"{gw_url}/v1/chat/completions", work.chat(i), keys[w % len(keys)])

    accs = {p: {"tokens": 0, "lat": [], "wall": 0.0} for p in ("direct", "gateway")}
    rounds = 4 if n >= 4 * c else 2
    chunks = [list(range(n))[r::rounds] for r in range(rounds)]
    cpu = 0.0
    for r, chunk in enumerate(chunks):
        for path in ("direct", "gateway") if r % 2 == 0 else ("gateway", "direct"):
            cpu0 = _cpu_seconds(gw_pid)
            await _block(session, direct if path == "direct" else via, chunk, c, accs[path])
            if path == "gateway":
                cpu += _cpu_seconds(gw_pid) - cpu0
    return _stats(accs["direct"]), _stats(accs["gateway"]), cpu


async def _run(quick: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    per_level = {1: 8, 16: 64, 64: 192} if quick else {1: 24, 16: 192, 64: 512}
    n_open = 200 if quick else 1000
    details: dict[str, Any] = {"max_tokens": MAX_TOKENS, "client": "aiohttp"}
    connector = aiohttp.TCPConnector(limit=4096)
    timeout = aiohttp.ClientTimeout(total=1200)
    with _engine() as (engine_url, model_dir), _gateway(engine_url, model_dir) as (gw_url, gw_pid):
        work = Workload(engine_url, model_dir)
        urls = (engine_url, gw_url, gw_pid)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            pids, keys = await _programs(session, gw_url, 64)
            await _check_same_request(session, work, gw_url, pids[0], keys[0])
            details["same_request_checked"] = True
            await _level(session, work, urls, keys, 8, 16)  # warm both paths
            cpu_s, gw_requests = 0.0, 0
            for c, n in per_level.items():
                direct, via, cpu = await _level(session, work, urls, keys, c, n)
                cpu_s += cpu
                gw_requests += via["requests"]
                details[f"c{c}"] = {"direct": direct, "gateway": via}
            t0 = time.perf_counter()
            _, open_keys = await _programs(session, gw_url, n_open)
            create_s = time.perf_counter() - t0
            direct, via, _ = await _level(session, work, urls, open_keys, n_open, n_open)
            details["open_programs"] = {
                "programs": n_open,
                "create_s": create_s,
                "thr_ratio": via["tok_per_s"] / direct["tok_per_s"],
                "direct": direct,
                "gateway": via,
            }
        await work.backend.aclose()
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
