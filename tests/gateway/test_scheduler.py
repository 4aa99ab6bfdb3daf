"""The pure scheduler core: FIFO, sticky routing, least-KV placement, dead-engine moves."""

from __future__ import annotations

import pytest

from rollyard.core.clock import FakeClock
from rollyard.core.errors import EngineUnavailable
from rollyard.gateway.scheduler import Scheduler


def sched(*engines: tuple[str, int]) -> Scheduler:
    s = Scheduler(FakeClock())
    for name, cap in engines:
        s.add_engine(name, cap)
    return s


def test_requests_start_in_arrival_order_when_capacity_frees() -> None:
    s = sched(("e", 1))
    for i in range(3):
        s.submit(f"r{i}", f"p{i}")
    assert [d.request_id for d in s.dispatch()] == ["r0"]
    s.complete("r0")
    assert [d.request_id for d in s.dispatch()] == ["r1"]
    s.complete("r1")
    assert [d.request_id for d in s.dispatch()] == ["r2"]


def test_new_programs_go_to_the_lowest_kv_engine_and_then_stick() -> None:
    s = sched(("a", 8), ("b", 8))
    s.update_engine("a", kv_usage=0.9)
    s.update_engine("b", kv_usage=0.1)
    s.submit("r1", "p")
    assert s.dispatch()[0].engine == "b"
    s.complete("r1")
    s.update_engine("a", kv_usage=0.0)
    s.update_engine("b", kv_usage=0.95)
    s.submit("r2", "p")
    assert s.dispatch()[0].engine == "b"  # sticky despite the change


def test_equal_kv_spreads_programs_across_engines() -> None:
    s = sched(("a", 8), ("b", 8))
    for i in range(4):
        s.submit(f"r{i}", f"p{i}")
    assert sorted(d.engine for d in s.dispatch()) == ["a", "a", "b", "b"]


def test_a_sticky_program_waits_for_its_engine_without_blocking_others() -> None:
    s = sched(("a", 1), ("b", 1))
    s.submit("r1", "p1")
    first = s.dispatch()[0]
    s.submit("r2", "p1")  # same program; its engine is full
    s.submit("r3", "p2")
    started = s.dispatch()
    assert [d.request_id for d in started] == ["r3"] and started[0].engine != first.engine
    s.complete("r1")
    assert [(d.request_id, d.engine) for d in s.dispatch()] == [("r2", first.engine)]


def test_a_dead_engines_programs_move_and_say_where_from() -> None:
    s = sched(("a", 4), ("b", 4))
    s.update_engine("b", kv_usage=0.5)
    s.submit("r1", "p")
    assert s.dispatch()[0].engine == "a"
    s.complete("r1")
    assert s.engine_down("a") == ["p"]
    s.submit("r2", "p")
    d = s.dispatch()[0]
    assert (d.engine, d.moved_from) == ("b", "a")


def test_no_engine_at_all_is_engine_unavailable() -> None:
    with pytest.raises(EngineUnavailable):
        Scheduler(FakeClock()).submit("r", "p")


def test_waiting_time_comes_from_the_injected_clock() -> None:
    clock = FakeClock()
    s = Scheduler(clock)
    s.add_engine("e", 1)
    s.submit("r1", "p1")
    s.submit("r2", "p2")
    s.dispatch()
    clock.advance(2.5)
    s.complete("r1")
    assert s.dispatch()[0].waited_s == 2.5


def test_cancelled_requests_never_start() -> None:
    s = sched(("e", 1))
    s.submit("r1", "p1")
    s.submit("r2", "p2")
    s.dispatch()
    s.cancel("r2")
    s.complete("r1")
    assert s.dispatch() == []
