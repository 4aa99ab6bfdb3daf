"""The per-dispatch KV index (``SchedState.claims``) changes the cost of a decision round,
never a decision: the same workload gives the same decisions with the index as with a scan
per question, and a round asks the programs once, not once per queued request."""

from __future__ import annotations

import heapq
import random
from typing import Any

import pytest

from rollyard.core.clock import FakeClock
from rollyard.core.program import ProgramState
from rollyard.sched import KvBudget, Scheduler, make_policy
from rollyard.sched import kv as kv_mod
from rollyard.sched.views import ProgramView


def decisions(policy: str, engines: int = 2, programs: int = 30, **options: Any) -> list[Any]:
    """Every decision of a multi-turn workload on ``engines`` engines whose KV is oversubscribed."""
    clock, rng = FakeClock(), random.Random(7)
    s = Scheduler(clock, make_policy(policy, **options))
    for e in range(engines):
        s.add_engine(f"e{e}", capacity=6, kv_capacity_tokens=4096)
        s.update_engine(f"e{e}", prefill_tok_s=400.0 + 300 * e)  # cost_aware may move
    ctx = {f"p{i}": 900 if i % 2 == 0 else 120 for i in range(programs)}
    left = dict.fromkeys(ctx, 5)
    events: list[tuple[float, int, str, str]] = []
    n, log = 0, []

    def at(t: float, kind: str, x: str) -> None:
        nonlocal n
        n += 1
        heapq.heappush(events, (t, n, kind, x))

    for p in ctx:
        at(rng.uniform(0, 3), "submit", p)
    tick = s.policy.tick_s or 0.0
    if tick:
        at(tick, "tick", "")
    while events and clock.now() < 5_000 and any(left.values()):
        t, _, kind, x = heapq.heappop(events)
        clock.advance(t - clock.now())
        if kind == "submit":
            n += 1
            s.submit(f"{x}#{n}", x, ctx[x], max_tokens=32 if int(x[1:]) % 3 else None)
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
            if s.admission_due():  # the room just released, as the gateway's pool does
                log += [(t, d) for d in s.admit()]
        else:
            log += [(t, d) for d in s.tick()]
            at(t + tick, "tick", "")
        got = s.dispatch()
        log += [(t, d) for d in got]
        for d in got:
            if hasattr(d, "request_id"):
                at(t + 1 + 0.003 * ctx[d.program_id], "done", f"{d.request_id}|{d.program_id}")
    assert not any(left.values()), "the workload must finish under every policy"
    return log


@pytest.fixture
def no_index(monkeypatch: pytest.MonkeyPatch) -> None:
    """``used`` scans every program, as before the index."""
    real = KvBudget.used

    def scan(self: KvBudget, state: Any, engine: str, now: float, decay: bool = False) -> float:
        was, state.indexing = state.indexing, False
        try:
            return real(self, state, engine, now, decay)
        finally:
            state.indexing = was

    monkeypatch.setattr(KvBudget, "used", scan)


@pytest.mark.parametrize(
    ("policy", "options"),
    [
        ("thunder", {}),
        ("rollyard", {}),
        ("thunder", {"router": "cost_aware"}),
        ("rollyard", {"router": "fewest_tokens", "buffer_tokens": 64}),
        ("thunder", {"acting_half_life_s": 2.0}),  # decayed questions always scan
    ],
)
def test_decisions_are_the_same_with_and_without_the_index(
    policy: str, options: dict[str, Any], request: pytest.FixtureRequest
) -> None:
    with_index = decisions(policy, **options)
    request.getfixturevalue("no_index")  # from here on every ``used`` scans, as before the index
    without = decisions(policy, **options)
    assert with_index == without
    kinds = {type(d).__name__ for _, d in with_index}
    assert {"Start", "Pause", "Restore"} <= kinds  # the workload exercises KV decisions


def test_a_dispatch_scans_the_programs_once_not_per_queued_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 programs, 500 requests queued behind a saturated engine: cost-aware routing weighs
    the other engine's KV room for every one of them; the programs are summed once."""
    s = Scheduler(FakeClock(), make_policy("rollyard"))
    s.add_engine("a", capacity=1, kv_capacity_tokens=10**9)
    s.add_engine("b", capacity=10_000, kv_capacity_tokens=10**9)
    s.update_engine("a", waiting=50)
    s.update_engine("b", prefill_tok_s=1000.0)
    s.state.engines["a"].service_s = 1.0
    s.state.engines["a"].in_flight = 1  # full, with a queue inside the engine
    for i in range(2000):
        s.register(f"p{i}", context_tokens=100).engine = "a" if i % 2 else "b"
    for i in range(1, 1000, 2):  # the programs on a
        s.submit(f"r{i}", f"p{i}", 100)
    scans = 0
    real = kv_mod.claims_by_engine

    def counted(state: Any, buffer_tokens: int) -> dict[str, tuple[int, int]]:
        nonlocal scans
        scans += 1
        return real(state, buffer_tokens)

    monkeypatch.setattr(kv_mod, "claims_by_engine", counted)
    claims = 0
    real_claim = KvBudget.claim

    def claim(self: KvBudget, p: ProgramView, now: float, decay: bool = False) -> float:
        nonlocal claims
        claims += 1
        return real_claim(self, p, now, decay)

    monkeypatch.setattr(KvBudget, "claim", claim)
    started = s.dispatch()
    assert sum(1 for d in started if type(d).__name__ == "Move") == 500  # each one weighed b's room
    assert scans == 1
    assert claims <= 2 * 500  # one need per candidate, no per-program sums
    s.tick()
    assert scans == 2


def test_the_index_follows_placements_within_a_dispatch() -> None:
    """A program placed during a dispatch counts on its engine for the requests after it."""
    s = Scheduler(FakeClock(), make_policy("thunder", buffer_tokens=0))
    s.add_engine("a", kv_capacity_tokens=1000)
    s.add_engine("b", kv_capacity_tokens=1000)
    for i, size in enumerate((600, 500, 300)):
        s.submit(f"r{i}", f"p{i}", size)
        s.dispatch()
    placed = {pid: p.engine for pid, p in s.state.programs.items()}
    assert placed == {"p0": "a", "p1": "b", "p2": "b"}  # fewest tokens: b had 500 < a's 600
    assert s.state.claims is None and not s.state.indexing  # nothing leaks out of a round
    assert all(p.state is ProgramState.ACTIVE for p in s.state.programs.values())


def test_the_decode_reserve_is_the_buffer_or_the_requests_max_tokens_if_smaller() -> None:
    """A turn that asks for 32 tokens cannot grow by the 256-token buffer: reserving it anyway
    made the pausing policies see a cache as full with a third of it free."""
    s = Scheduler(FakeClock(), make_policy("thunder", buffer_tokens=256))
    s.add_engine("a", kv_capacity_tokens=2000)
    s.submit("r0", "small", 400, max_tokens=32)
    s.submit("r1", "open", 400)  # no max_tokens: the whole buffer
    s.dispatch()
    budget = KvBudget(256)
    assert budget.used(s.state, "a", 0.0) == (400 + 32) + (400 + 256)
    s.state.indexing = True  # the index gives the same sum, and places with the same claims
    assert budget.used(s.state, "a", 0.0) == (400 + 32) + (400 + 256)
    assert KvBudget(16).used(s.state, "a", 0.0) == 800 + 2 * 16  # another buffer: a fresh index
