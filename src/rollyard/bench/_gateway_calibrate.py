"""``rollyard sim calibrate --gateway``: the real gateway's CPU per request, for the simulator.

A ``rollyard gateway`` process in front of the canned engine (``engines.canned``: answers at
once, so what is timed is the gateway's own work, read from its process's CPU time, as
``rollyard bench gateway`` reads ``cpu_ms_per_req``). Three kinds of waves, each ``concurrency``
requests sent at once from that many programs, the gateway's CPU over the wave / its requests
being one point:

- agent turns: every program extends its own conversation turn after turn (the answer the
  gateway returned echoed back, then a tool result of ``tool_tokens``), so prompts grow from a
  short task to tens of thousands of tokens, the history the gateway renders or reuses;
- whole answers of ``outputs`` tokens from fresh short prompts;
- the same streamed (an event per token from the engine and to the client).

``sim.calibrate.fit_gateway`` fits the points to ``GatewayCost``: nothing assumes how the cost
grows with history, a gateway whose turns cost the same at any length fits a small
``per_prompt_token_s``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import aiohttp

from rollyard.bench._procs import ADMIN, _canned, _cpu_seconds, _gateway, pin
from rollyard.sim.calibrate import fit_gateway
from rollyard.sim.costs import GatewayCost
from rollyard.sim.profile import write_yaml

__all__ = ["calibrate_gateway", "measure_gateway", "pin"]

WORDS = ("alpha", "beta", "gamma", "delta", "omega", "river", "stone", "cloud", "tower", "field")


def text(words: int, salt: int) -> str:
    """About ``words`` words that differ per ``salt`` (no two programs' prompts alike)."""
    return " ".join(f"{WORDS[(i * 7 + salt) % len(WORDS)]}{(i + salt) % 97}" for i in range(words))


async def new_programs(session: aiohttp.ClientSession, url: str, n: int, out: int) -> list[str]:
    """``n`` programs whose turns answer exactly ``out`` tokens; their keys."""
    keys = []
    for _ in range(n):
        body = {"sampling": {"temperature": 1.0, "max_tokens": out}}
        async with session.post(f"{url}/programs", json=body, headers={"x-api-key": ADMIN}) as r:
            r.raise_for_status()
            keys.append((await r.json())["api_key"])
    return keys


async def chat(
    session: aiohttp.ClientSession, url: str, key: str, messages: list[dict[str, Any]], out: int, stream: bool
) -> tuple[int, int, dict[str, Any] | None]:
    """One turn: (prompt tokens, output tokens, the assistant message returned; None streamed)."""
    body = {"model": "tiny", "messages": messages, "max_tokens": out, "temperature": 1.0}
    headers = {"Authorization": f"Bearer {key}"}
    if not stream:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            r.raise_for_status()
            data = await r.json()
        return (
            data["usage"]["prompt_tokens"],
            data["usage"]["completion_tokens"],
            data["choices"][0]["message"],
        )
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    usage: dict[str, int] = {}
    async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
        r.raise_for_status()
        async for line in r.content:
            if line.startswith(b'data: {"') and b'"usage"' in line:
                usage = json.loads(line[6:]).get("usage") or usage
    return usage.get("prompt_tokens", 0), usage.get("completion_tokens", out), None


async def _wave(
    session: aiohttp.ClientSession, url: str, pid: int, calls: list[tuple[str, list[dict[str, Any]]]],
    out: int, stream: bool,
) -> tuple[list[tuple[int, int, dict[str, Any] | None]], float]:  # fmt: skip
    """Every call at once; (their results, the gateway's CPU seconds per request)."""
    cpu0 = _cpu_seconds(pid)
    got = await asyncio.gather(*(chat(session, url, k, m, out, stream) for k, m in calls))
    return list(got), (_cpu_seconds(pid) - cpu0) / len(calls)


async def _measure(
    url: str,
    pid: int,
    *,
    concurrency: int,
    turns: int,
    tool_words: int,
    outputs: tuple[int, int],
    repeats: int,
) -> list[tuple[float, float, float, bool, float]]:
    """(prompt tokens, new tokens, output tokens, streamed, gateway CPU s per request) per wave."""
    points: list[tuple[float, float, float, bool, float]] = []
    timeout = aiohttp.ClientTimeout(total=600)
    connector = aiohttp.TCPConnector(limit=4096, keepalive_timeout=3.0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as s:
        short = outputs[0]
        # warm-up: a wave of each shape, unmeasured
        keys = await new_programs(s, url, concurrency, short)
        warm = [(k, [{"role": "user", "content": text(40, i)}]) for i, k in enumerate(keys)]
        await _wave(s, url, pid, warm, short, False)
        for rep in range(repeats):
            keys = await new_programs(s, url, concurrency, short)
            convs = [[{"role": "user", "content": text(200, rep * 1000 + i)}] for i in range(concurrency)]
            before = 0.0
            for t in range(turns):  # agent turns: each program's history grows
                got, cpu = await _wave(s, url, pid, list(zip(keys, convs, strict=True)), short, False)
                prompt = sum(g[0] for g in got) / len(got)
                points.append((prompt, prompt - before, sum(g[1] for g in got) / len(got), False, cpu))
                before = prompt
                for i, (_, _, msg) in enumerate(got):
                    assert msg is not None
                    tool = {"role": "user", "content": text(tool_words, rep * 1000 + i + 31 * t)}
                    convs[i] += [{k: v for k, v in msg.items() if v is not None}, tool]
            for out in outputs:
                for stream in (False, True):
                    keys = await new_programs(s, url, concurrency, out)
                    calls = [
                        (k, [{"role": "user", "content": text(40, rep * 1000 + i)}])
                        for i, k in enumerate(keys)
                    ]
                    got, cpu = await _wave(s, url, pid, calls, out, stream)
                    prompt = sum(g[0] for g in got) / len(got)
                    points.append((prompt, prompt, out, stream, cpu))
    return points


def measure_gateway(
    *, concurrency: int = 32, turns: int = 10, tool_words: int = 600, outputs: tuple[int, int] = (32, 256),
    repeats: int = 2, core: str | None = None,
) -> list[tuple[float, float, float, bool, float]]:  # fmt: skip
    """Start the canned engine and a real gateway, time the waves; ``core`` pins the gateway."""
    canned = _canned(max_model_len=65536, token_interval_ms=1.0)
    with canned as (engine_url, model_dir), _gateway(engine_url, model_dir) as (url, pid):
        if core is not None:
            pin(pid, core)
        return asyncio.run(
            _measure(url, pid, concurrency=concurrency, turns=turns, tool_words=tool_words,
                     outputs=outputs, repeats=repeats)
        )  # fmt: skip


def gateway_cost(
    points: list[tuple[float, float, float, bool, float]], source: str
) -> tuple[GatewayCost, str]:
    """The fitted cost and a comment recording the points and the fit (the file's header)."""
    coef = fit_gateway(points)
    cost = GatewayCost(source=source, **{k: v for k, v in coef.items() if k != "max_rel_err"})
    rows = ", ".join(
        f"({p:.0f},{n:.0f},{o:.0f},{'s' if st else 'w'},{1000 * c:.2f})" for p, n, o, st, c in points
    )
    comment = (
        f"fit: {coef}\npoints (prompt tokens, new tokens, output tokens, whole/streamed, CPU ms per"
        f" request): {rows}"
    )
    return cost, comment


def calibrate_gateway(path: Path, *, quick: bool = False) -> GatewayCost:
    """Measure, fit, write ``path`` (a ``GatewayCost`` YAML: ``rollyard sim --gateway FILE``)."""
    t0 = time.perf_counter()
    load0 = os.getloadavg()[0]
    points = measure_gateway(turns=6 if quick else 10, repeats=1 if quick else 2)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    source = (
        f"rollyard sim calibrate --gateway, canned engine, {stamp}, load {load0:.1f}-{os.getloadavg()[0]:.1f}"
    )
    cost, comment = gateway_cost(points, source)
    write_yaml(path, cost.model_dump(mode="json"), f"{comment}\nwall {time.perf_counter() - t0:.0f} s")
    return cost
