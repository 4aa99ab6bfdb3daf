"""The gateway bench's clients: what request n is (a chat for the gateway, the identical engine
body for the direct path and the relay), how a closed loop of workers sends a block of them, and
how their latencies are counted (``rollyard bench soak`` takes its percentile from here too)."""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from rollyard.bench._procs import ADMIN

MAX_TOKENS = 32
# Temperature 1 (what RL rollouts use): the random tiny model, decoded greedily, often emits eos
# first, which would turn the bench into a 1-token prefill test.
SAMPLING = {"temperature": 1.0, "max_tokens": MAX_TOKENS}


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

    async def direct(self, n: int, stream: bool = False) -> dict[str, Any]:
        return await self._engine_body(self.chat(n), stream)

    async def direct_history(self, messages: list[dict[str, Any]]) -> dict[str, Any]:
        """The engine body of a chat with these messages, its ids rendered fresh."""
        chat = {**self.chat(0), "messages": messages}
        return await self._engine_body(chat, False)

    async def _engine_body(self, chat: dict[str, Any], stream: bool) -> dict[str, Any]:
        from rollyard.gateway.routes_openai_chat import ChatCompletionBody, to_request
        from rollyard.gateway.sampling import context_limit, sampling_for

        request = to_request(ChatCompletionBody(**chat))
        ids = self.renderer.render_fresh(request)
        await self.backend.model_name()
        limit = context_limit(self.program, self.backend.max_model_len)
        params = sampling_for(request, self.program, len(ids), limit)
        return await self.backend.completion_body(ids, params, stream=stream)


def _server_timing(header: str) -> dict[str, float]:
    """``engine;dur=12.5, gateway;dur=0.8`` -> {"engine": 0.0125, "gateway": 0.0008} (seconds)."""
    out = {}
    for part in header.split(","):
        name, _, dur = part.strip().partition(";dur=")
        if dur:
            out[name] = float(dur) / 1000
    return out


async def _post(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], key: str | None
) -> tuple[int, dict[str, float]]:
    """POST; completion tokens and the answer's ``Server-Timing`` (raises on an error status)."""
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with session.post(url, json=body, headers=headers) as r:
        data = await r.json()
        r.raise_for_status()
        timing = _server_timing(r.headers.get("server-timing", ""))
    return int(data["usage"]["completion_tokens"]), timing


def _acc() -> dict[str, Any]:
    return {"tokens": 0, "lat": [], "own": [], "outside_engine": [], "wall": 0.0}


async def _block(
    session: aiohttp.ClientSession, send: Any, ns: list[int], concurrency: int, acc: dict[str, Any]
) -> None:
    """Send requests ``ns`` from ``concurrency`` closed-loop workers; accumulate into ``acc``."""
    todo = iter(ns)

    async def worker(w: int) -> None:
        for n in todo:
            t0 = time.perf_counter()
            got, timing = await send(session, n, w)  # not `acc[...] += await ...`: reads first
            lat = time.perf_counter() - t0
            acc["tokens"] += got
            acc["lat"].append(lat)
            if "gateway" in timing:
                acc["own"].append(timing["gateway"])
                acc["outside_engine"].append(lat - timing["engine"])

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    acc["wall"] += time.perf_counter() - t0


def _pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def _stats(acc: dict[str, Any]) -> dict[str, Any]:
    lat = acc["lat"]
    out = {
        "requests": len(lat),
        "req_per_s": len(lat) / acc["wall"],
        "tokens_per_req": acc["tokens"] / len(lat),
        "tok_per_s": acc["tokens"] / acc["wall"],
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * _pct(lat, 0.99),
    }
    if acc["own"]:  # what the gateway reports as its own time, and what the client sees beyond the engine
        out["own_p50_ms"] = 1000 * statistics.median(acc["own"])
        out["own_p99_ms"] = 1000 * _pct(acc["own"], 0.99)
        out["client_minus_engine_p50_ms"] = 1000 * statistics.median(acc["outside_engine"])
    return out


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
