"""Policies driven through a whole agent workload under a fake clock: every program finishes
(no policy deadlocks), and rollyard bounds what thunder does not: the longest hold, and how
much longer long-prompt programs wait for their first answer than short ones."""

from __future__ import annotations

import heapq
import random
import statistics
from dataclasses import dataclass, field

import pytest

from rollyard.core.clock import FakeClock
from rollyard.sched import Scheduler, Start, make_policy


@dataclass
class Outcome:
    finished: int = 0
    waits: list[float] = field(default_factory=list)
    first_wait: dict[str, float] = field(default_factory=dict)


def run(policy: str, programs: int = 24, turns: int = 6, kv: int = 8192, seed: int = 0) -> Outcome:
    """An engine whose request takes 2 s + 2 ms per context token; tools take 0.5-2 s; even
    programs start with 700 tokens, odd ones with 90; each turn adds 32 + 50-150 tokens."""
    clock, rng, out = FakeClock(), random.Random(seed), Outcome()
    s = Scheduler(clock, make_policy(policy))
    s.add_engine("e", capacity=256, kv_capacity_tokens=kv)
    ctx = {f"p{i}": 700 if i % 2 == 0 else 90 for i in range(programs)}
    left = dict.fromkeys(ctx, turns)
    events: list[tuple[float, int, str, str]] = []
    submitted: dict[str, float] = {}
    n = 0

    def at(t: float, kind: str, x: str) -> None:
        nonlocal n
        n += 1
        heapq.heappush(events, (t, n, kind, x))

    for p in ctx:
        at(0.0, "submit", p)
    tick = s.policy.tick_s or 0.0
    if tick:
        at(tick, "tick", "")
    while events and clock.now() < 20_000:
        t, _, kind, x = heapq.heappop(events)
        clock.advance(t - clock.now())
        if kind == "submit":
            n += 1
            submitted[f"{x}#{n}"] = t
            s.submit(f"{x}#{n}", x, ctx[x])
        elif kind == "done":
            rid, p = x.split("|")
            s.complete(rid, 32)
            ctx[p] += 32
            s.observe(p, context_tokens=ctx[p])
            left[p] -= 1
            if left[p]:
                ctx[p] += rng.randint(50, 150)
                at(t + rng.uniform(0.5, 2.0), "submit", p)
            else:
                s.forget(p)
                out.finished += 1
            if s.admission_due():  # released room, handed out as the gateway's pool does
                s.admit()
        elif out.finished < programs:
            s.tick()
            at(t + tick, "tick", "")
        for d in s.dispatch():
            if isinstance(d, Start):
                wait = t - submitted[d.request_id]
                out.waits.append(wait)
                out.first_wait.setdefault(d.program_id, wait)
                at(t + 2 + 0.002 * ctx[d.program_id], "done", f"{d.request_id}|{d.program_id}")
    return out


def long_short(o: Outcome) -> float:
    """Median first-response time (wait + service) of long-prompt over short-prompt programs."""
    first = {p: w + 2 + 0.002 * (700 if int(p[1:]) % 2 == 0 else 90) for p, w in o.first_wait.items()}
    long = statistics.median(v for p, v in first.items() if int(p[1:]) % 2 == 0)
    return long / statistics.median(v for p, v in first.items() if int(p[1:]) % 2 == 1)


@pytest.mark.parametrize("policy", ["fifo", "thunder", "rollyard"])
def test_every_program_finishes(policy: str) -> None:
    assert run(policy).finished == 24


@pytest.mark.parametrize("kv", [6144, 8192])
def test_rollyard_bounds_the_hold_and_narrows_the_long_short_gap_thunder_leaves(kv: int) -> None:
    """In this model thunder's long/short first-response ratio is 4.3 (kv 6144) and 10.1 (8192),
    its longest hold 105 s and 68 s; rollyard's 1.8 and 2.7 (the issue's goal: <= 3), holds
    of 17 s and 12 s (bound: 30 s)."""
    thunder, ours = run("thunder", kv=kv), run("rollyard", kv=kv)
    assert max(ours.waits) <= 30.0 + 1.0  # the bound, plus one tick
    assert max(thunder.waits) > max(ours.waits)
    assert long_short(ours) <= 3.0 < long_short(thunder)
