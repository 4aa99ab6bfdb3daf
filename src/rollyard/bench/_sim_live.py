"""The live half of ``rollyard bench sim``: a workload's programs as scripted clients of the real
gateway in front of a real vLLM, recorded as a trace the simulator can replay.

Each program is created through ``POST /programs`` and plays its plan: a user message of about
the plan's prompt size (its group's task prompt, the same for the group's members only), then
per turn a chat completion with ``max_tokens`` = the plan's output length (``ignore_eos`` in
the program's sampling: exactly that many), a sleep of the plan's tool latency and a
tool-result message of about the plan's tool size; it finishes through
``POST /programs/{id}/finish`` (the scheduler forgets it). The token counts the gateway reports
(``usage``) are what the trace keeps, so the simulated replay sees the prompt and output sizes
the engine really processed, even where a text's token count differed from the plan.

The trace follows the live clock, not the plan's: each program's first request at the time it
was sent, each tool gap as measured from an answer to the next request (the sleep, plus the
client's own work on a loaded machine), and how long the gateway had been up when the run
started (its engine polls and policy ticks run on that phase).
"""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from rollyard.bench._procs import ADMIN
from rollyard.core.engine_key import engine_headers
from rollyard.sim.workload import ProgramPlan, Turn

__all__ = ["LiveRun", "run_live"]


WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa", "sigma", "omega", "river")


@dataclass
class LiveRun:
    plans: list[ProgramPlan]  # what was really sent: token counts from the gateway's usage
    request_latency: list[float] = field(default_factory=list)
    output_tokens: int = 0
    makespan_s: float = 0.0
    preemptions: int = 0
    pauses: int = 0  # the gateway's scheduler (rollyard_sched_pauses_total over the run)
    restores: int = 0
    hold_s_total: float = 0.0  # rollyard_sched_hold_seconds_sum: the restored programs' holds
    shell_up_s: float = 0.0  # how long the gateway had been up when the run started
    cpu_cores: dict[str, float] = field(default_factory=dict)  # busy cores during the run, by whom

    def summary(self) -> dict[str, Any]:
        from rollyard.sim.stats import quantile

        return {
            "output_tok_s": self.output_tokens / self.makespan_s if self.makespan_s else 0.0,
            "makespan_s": self.makespan_s,
            "req_p50_s": quantile(self.request_latency, 0.5),
            "req_p99_s": quantile(self.request_latency, 0.99),
            "preemptions": self.preemptions,
            "pauses": self.pauses,
            "restores": self.restores,
            "hold_s_total": self.hold_s_total,
            "shell_up_s": self.shell_up_s,
            "cpu_cores": self.cpu_cores,
        }


def _text(n: int, seed: int) -> str:
    """About n tokens of text (the tiny tokenizer spends ~2.4 tokens on one of these words)."""
    return " ".join(WORDS[(seed * 7 + i) % len(WORDS)] for i in range(max(1, round(n / 2.4))))


def _task(plan: ProgramPlan) -> str:
    """The group's task prompt: one text for its members, another for every other group. (One
    text for every program let all of them share a prefix that the replay does not model: the
    simulator shares task-prompt blocks within a group only.)"""
    return f"task {plan.group_id}: " + _text(plan.turns[0].prompt_tokens - 5, 0)


async def _counter(
    client: aiohttp.ClientSession, url: str, name: str, headers: dict[str, str] | None = None
) -> float:
    """A sample's value on a Prometheus ``/metrics`` page (0 when it is not there)."""
    async with client.get(f"{url}/metrics", headers=headers) as r:
        text = await r.text()
    m = re.search(rf"^{name}(?:\{{[^}}]*\}})? ([0-9.e+]+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


async def _counters(client: aiohttp.ClientSession, url: str, engine_url: str) -> tuple[float, ...]:
    """(engine preemptions, gateway pauses, restores, hold seconds) so far."""
    admin = {"x-api-key": ADMIN}
    return (
        await _counter(client, engine_url, "vllm:num_preemptions_total", engine_headers()),
        await _counter(client, url, "rollyard_sched_pauses_total", admin),
        await _counter(client, url, "rollyard_sched_restores_total", admin),
        await _counter(client, url, "rollyard_sched_hold_seconds_sum", admin),
    )


async def _program(
    client: aiohttp.ClientSession, url: str, plan: ProgramPlan, t0: float, out: LiveRun, turns: list[Turn]
) -> float:
    """Play one plan; returns when its first request was sent (after ``t0``)."""
    async with client.post(
        f"{url}/programs",
        json={
            "group_id": plan.group_id,
            "group_size": plan.group_size,
            "sampling": {"temperature": 1.0, "ignore_eos": True},
        },
        headers={"x-api-key": ADMIN},
        raise_for_status=True,
    ) as r:
        prog = await r.json()
    key = {"authorization": f"Bearer {prog['api_key']}"}
    messages: list[dict[str, Any]] = [{"role": "user", "content": _task(plan)}]
    last_context, first, last_done = 0, 0.0, 0.0
    for i, turn in enumerate(plan.turns):
        body = {"model": "tiny", "messages": messages, "max_tokens": turn.output_tokens, "temperature": 1.0}
        sent = time.perf_counter()
        if i == 0:
            first = sent - t0
        async with client.post(
            f"{url}/v1/chat/completions", json=body, headers=key, raise_for_status=True
        ) as r:
            doc = await r.json()
        done = time.perf_counter()
        usage = doc["usage"]
        out.request_latency.append(done - sent)
        out.output_tokens += usage["completion_tokens"]
        if turns:  # the previous turn's tool: what this prompt added, and the gap as it was live
            prev = turns[-1]
            added = usage["prompt_tokens"] - last_context
            turns[-1] = Turn(prev.prompt_tokens, prev.output_tokens, sent - last_done, max(0, added))
        turns.append(Turn(usage["prompt_tokens"], usage["completion_tokens"], 0.0, 0))
        last_done = done
        last_context = usage["prompt_tokens"] + usage["completion_tokens"]
        if i + 1 < len(plan.turns):
            messages.append({"role": "assistant", "content": doc["choices"][0]["message"]["content"] or ""})
            messages.append({"role": "user", "content": _text(turn.tool_tokens, i + 1)})
            await asyncio.sleep(turn.tool_s)
    async with client.post(f"{url}/programs/{prog['id']}/finish", json={}, headers={"x-api-key": ADMIN}):
        pass
    return first


async def _run(url: str, engine_url: str, plans: list[ProgramPlan], up_at: float | None) -> LiveRun:
    # aiohttp, not httpx: httpx's client spent 2-8 ms of CPU per request here (8 at 64 programs),
    # more than the gateway it was measuring, so the "gateway-bound" levels were client-bound
    connector = aiohttp.TCPConnector(limit=len(plans) + 8)
    timeout = aiohttp.ClientTimeout(total=600.0)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as client:
        before = await _counters(client, url, engine_url)
        out = LiveRun([])
        traces: list[list[Turn]] = [[] for _ in plans]
        t0 = time.perf_counter()
        out.shell_up_s = t0 - up_at if up_at is not None else 0.0
        starts = await asyncio.gather(
            *(_program(client, url, p, t0, out, traces[i]) for i, p in enumerate(plans))
        )
        out.makespan_s = time.perf_counter() - t0
        after = await _counters(client, url, engine_url)
        preempt, pauses, restores, out.hold_s_total = (a - b for a, b in zip(after, before, strict=True))
        out.preemptions, out.pauses, out.restores = int(preempt), int(pauses), int(restores)
        out.plans = [
            ProgramPlan(p.id, p.group_id, p.group_size, t, s)
            for p, t, s in zip(plans, traces, starts, strict=True)
        ]
        return out


def run_live(
    gateway_url: str, engine_url: str, plans: list[ProgramPlan], up_at: float | None = None
) -> LiveRun:
    """Play every plan at once against the gateway; returns the trace and what was measured.
    ``up_at``: ``time.perf_counter()`` when the gateway came up (its /health first answered)."""
    return asyncio.run(_run(gateway_url, engine_url, plans, up_at))
