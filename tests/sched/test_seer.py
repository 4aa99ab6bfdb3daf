"""Seer's parts under a fake clock: probe first, longest first, the estimate, starvation, moves."""

from __future__ import annotations

import pytest

from rollyard.core.clock import FakeClock
from rollyard.core.errors import ConfigError
from rollyard.sched import Move, Scheduler, Start, make_policy


def seer(*engines: tuple[str, int], **options: float) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    s = Scheduler(clock, make_policy("seer", **options))
    for name, cap in engines:
        s.add_engine(name, cap)
    return s, clock


def group(s: Scheduler, gid: str, size: int) -> list[str]:
    pids = [f"{gid}-{i}" for i in range(size)]
    for pid in pids:
        s.register(pid, gid, size)
    return pids


def started(decisions: list) -> list[str]:
    return [d.request_id for d in decisions if isinstance(d, Start)]


def test_a_new_groups_first_request_runs_first_as_the_probe_with_high_priority() -> None:
    s, clock = seer(("e", 1))
    a = group(s, "A", 3)
    for i, pid in enumerate(a):
        s.submit(f"a{i}", pid, max_tokens=100)
        clock.advance(0.1)
    first = s.dispatch()
    assert started(first) == ["a0"] and first[0].priority == 0
    s.complete("a0", 10)
    nxt = s.dispatch()
    assert nxt[0].priority == 1  # the group has an estimate now: no more probes


def test_probes_of_several_groups_go_shortest_progress_first_ahead_of_the_rest() -> None:
    s, clock = seer(("e", 1))
    s.submit("busy", "solo")  # occupies the engine
    s.dispatch()
    a, b = group(s, "A", 2), group(s, "B", 2)
    s.submit("a0", a[0], prompt_tokens=10, max_tokens=100)
    s.submit("a1", a[1], prompt_tokens=10, max_tokens=100)
    s.submit("b0", b[0], prompt_tokens=5, max_tokens=100)
    s.submit("b1", b[1], prompt_tokens=5, max_tokens=100)
    order = s.policy.order.order(s.state.queue, s.state, clock.now())
    assert [r.request_id for r in order] == ["b0", "a0", "a1", "b1"]


def test_the_group_estimate_is_the_longest_finished_sibling_and_updates_online() -> None:
    s, _ = seer(("e", 8))
    a = group(s, "A", 3)
    s.submit("a0", a[0], max_tokens=500)
    s.dispatch()
    est = s.policy.order
    s.submit("a1", a[1], max_tokens=500)
    assert est.estimate(s.state.queue[0], s.state) == 500  # none finished: max_tokens
    s.complete("a0", 40)
    assert est.estimate(s.state.queue[0], s.state) == 40
    s.dispatch()
    s.complete("a1", 120)
    s.submit("a2", a[2], max_tokens=500)
    assert est.estimate(s.state.queue[0], s.state) == 120
    s.forget(a[0])
    s.forget(a[1])  # finished programs leave; the estimate stays
    assert est.estimate(s.state.queue[0], s.state) == 120


def test_remaining_requests_are_served_longest_estimate_first() -> None:
    s, clock = seer(("e", 2))
    a, b = group(s, "A", 2), group(s, "B", 2)
    s.submit("a0", a[0], max_tokens=1000)
    s.submit("b0", b[0], max_tokens=1000)
    assert sorted(started(s.dispatch())) == ["a0", "b0"]  # the two probes
    s.complete("a0", 30)
    s.complete("b0", 900)
    s.submit("a1", a[1], max_tokens=1000)
    clock.advance(1)
    s.submit("b1", b[1], max_tokens=1000)
    out = s.dispatch()
    assert started(out) == ["b1", "a1"]  # B's estimate (900) beats A's (30) despite arriving later


def test_a_request_waiting_past_the_starvation_bound_goes_next() -> None:
    s, clock = seer(("e", 1), starve_s=5.0)
    a, b = group(s, "A", 2), group(s, "B", 2)
    s.submit("b0", b[0], max_tokens=1000)
    s.dispatch()
    s.complete("b0", 900)  # B is long
    s.submit("hold", "solo")
    s.dispatch()  # engine busy
    s.state.group_longest["A"] = 10
    s.submit("a1", a[1], max_tokens=1000)  # short group: would be last
    clock.advance(6.0)
    s.submit("b1", b[1], max_tokens=1000)
    order = s.policy.order.order(s.state.queue, s.state, clock.now())
    assert [r.request_id for r in order] == ["a1", "b1"]
    s.complete("hold")
    first = s.dispatch()[0]
    assert first.request_id == "a1" and first.priority == 0


def test_a_chunk_whose_engine_is_full_moves_to_a_free_engine() -> None:
    s, _ = seer(("a", 1), ("b", 1))
    s.submit("c0", "p", prompt_tokens=100, max_tokens=512, chunk=0)
    assert s.dispatch()[0].engine == "a"  # equally idle: by name
    s.complete("c0", final=False)
    s.submit("other", "q")
    assert s.dispatch()[0].engine == "a"  # takes p's engine meanwhile
    s.submit("c1", "p", prompt_tokens=164, max_tokens=448, chunk=1)
    move, start = s.dispatch()
    assert isinstance(move, Move) and (move.src, move.dst) == ("a", "b")
    assert isinstance(start, Start) and start.engine == "b" and start.moved_from == "a"
    assert s.state.programs["p"].engine == "b"


def test_a_move_that_costs_more_re_prefill_than_allowed_waits_instead() -> None:
    s, _ = seer(("a", 1), ("b", 1), max_move_s=0.01, prefill_tok_s=1000.0)
    s.register("p")
    s.state.programs["p"].engine = "a"
    s.submit("busy", "q")
    s.state.programs["q"].engine = "a"
    s.dispatch()
    s.submit("c1", "p", prompt_tokens=500, chunk=1)  # 0.5 s of re-prefill > 0.01 s
    assert s.dispatch() == []
    s.complete("busy")
    assert [d.engine for d in s.dispatch()] == ["a"]


def test_with_a_kv_pool_the_same_move_costs_its_load_and_goes_ahead() -> None:
    s, _ = seer(("a", 1), ("b", 1), max_move_s=0.01, prefill_tok_s=1000.0, pool_load_tok_s=100_000.0)
    s.register("p")
    s.state.programs["p"].engine = "a"
    s.submit("busy", "q")
    s.state.programs["q"].engine = "a"
    s.dispatch()
    s.submit("c1", "p", prompt_tokens=500, chunk=1)  # 0.005 s to load from the pool <= 0.01 s
    move, start = s.dispatch()
    assert isinstance(move, Move) and (move.src, move.dst) == ("a", "b")
    assert isinstance(start, Start) and start.engine == "b"


def test_a_chunk_moves_to_balance_only_when_the_other_engine_runs_balance_fewer() -> None:
    s, _ = seer(("a", 8), ("b", 8))
    for pid in ("p", "q", "r"):
        s.register(pid)
        s.state.programs[pid].engine = "a"
    s.submit("q0", "q")
    s.submit("p0", "p", prompt_tokens=100, max_tokens=1024)
    s.dispatch()
    s.complete("p0", final=False)
    # p's next chunk would run as a's 2nd request, b runs none: 2 - 0 >= balance (2)
    s.submit("p1", "p", prompt_tokens=356, max_tokens=768, chunk=1)
    move, start = s.dispatch()
    assert isinstance(move, Move) and (move.src, move.dst, move.reason) == ("a", "b", "balance")
    assert isinstance(start, Start) and start.engine == "b" and start.moved_from == "a"
    # q's next chunk: a would run 1 (q alone), b runs 1 (p): no move
    s.complete("q0", final=False)
    s.submit("q1", "q", prompt_tokens=356, max_tokens=768, chunk=1)
    assert [(type(d).__name__, d.engine) for d in s.dispatch()] == [("Start", "a")]
    # a new request (not a chunk) stays where its program is, however uneven the engines
    s.submit("r0", "r")
    s.submit("r-other", "q")
    assert all(isinstance(d, Start) and d.engine == "a" for d in s.dispatch())


def test_a_larger_balance_keeps_chunks_home_longer() -> None:
    s, _ = seer(("a", 8), ("b", 8), balance=3)
    s.register("p")
    s.state.programs["p"].engine = "a"
    s.register("q")
    s.state.programs["q"].engine = "a"
    s.submit("q0", "q")
    s.dispatch()
    s.submit("p1", "p", prompt_tokens=300, max_tokens=768, chunk=1)  # a would run 2, b 0: 2 < 3
    assert [d.engine for d in s.dispatch()] == ["a"]


def test_group_bound_keeps_a_group_on_its_first_engine() -> None:
    clock = FakeClock()
    s = Scheduler(clock, make_policy("group_bound"))
    s.add_engine("a", 8)
    s.add_engine("b", 8)
    a, b = group(s, "A", 3), group(s, "B", 3)
    for pid in a + b:
        s.submit(f"r-{pid}", pid)
    engines = {d.program_id: d.engine for d in s.dispatch() if isinstance(d, Start)}
    assert len({engines[p] for p in a}) == 1 and len({engines[p] for p in b}) == 1
    assert engines[a[0]] != engines[b[0]]


def test_seer_order_composes_on_another_preset_and_bad_options_are_config_errors() -> None:
    p = make_policy("fifo", order="seer")
    assert p.name == "fifo[least_loaded,admit_all,seer]"
    with pytest.raises(ConfigError, match="starve_s"):
        make_policy("seer", starve_s=0)
