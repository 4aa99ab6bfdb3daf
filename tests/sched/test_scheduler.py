"""The pure scheduler core: FIFO, sticky routing, least-KV placement, dead-engine moves, phases."""

from __future__ import annotations

import pytest

from rollyard.core.clock import FakeClock
from rollyard.core.errors import EngineUnavailable
from rollyard.sched import Scheduler


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


def test_a_program_is_reasoning_while_its_request_is_open_and_acting_after_any_ending() -> None:
    s = sched(("e", 1))
    s.submit("r1", "p")
    s.submit("r2", "q")
    assert s.state.programs["p"].phase == "reasoning"
    s.dispatch()
    s.complete("r1", output_tokens=7)  # finished normally
    assert s.state.programs["p"].phase == "acting"
    assert list(s.state.programs["p"].output_lengths) == [7]
    s.cancel("r2")  # the client went away while queued
    assert s.state.programs["q"].phase == "acting"
    assert s.state.programs["q"].waiting_since is None


def test_a_divided_requests_chunks_keep_the_program_reasoning() -> None:
    s = sched(("e", 1))
    s.submit("r1", "p", 10, max_tokens=64)
    s.dispatch()
    s.submit("r1.1", "p", 74, max_tokens=64, chunk=1)
    s.complete("r1", 64, final=False)
    assert s.state.programs["p"].phase == "reasoning"
    assert [d.request_id for d in s.dispatch()] == ["r1.1"]
    s.complete("r1.1", 128)
    assert s.state.programs["p"].phase == "acting" and s.state.programs["p"].turns == 1


def test_a_paused_programs_requests_are_held_until_it_is_restored() -> None:
    from rollyard.sched import Pause, Restore

    class Scripted:
        def __init__(self) -> None:
            self.decisions: list[Pause | Restore] = []

        def tick(self, state: object, now: float) -> list[Pause | Restore]:
            return self.decisions

    from rollyard.sched import FifoOrder, LeastLoaded, Policy

    admission = Scripted()
    s = Scheduler(FakeClock(), Policy("scripted", LeastLoaded(), admission, FifoOrder()))
    s.add_engine("a", 4)
    s.add_engine("b", 4)
    s.register("p")
    admission.decisions = [Pause("p", None)]
    assert s.tick() == admission.decisions and s.state.programs["p"].paused
    s.submit("r1", "p")
    assert s.dispatch() == []
    admission.decisions = [Restore("p", "b")]
    s.tick()
    assert [(d.request_id, d.engine) for d in s.dispatch()] == [("r1", "b")]


def test_unknown_policy_names_are_a_clear_error_listing_the_choices() -> None:
    from rollyard.core.errors import ConfigError
    from rollyard.sched import make_policy

    with pytest.raises(ConfigError, match=r"choose one of: .*fifo"):
        make_policy("nonesuch")
    with pytest.raises(ConfigError, match="unknown order"):
        make_policy("fifo", order="nonesuch")
    assert make_policy("fifo").name == "fifo"


def test_the_decision_core_imports_without_the_gateway_stack() -> None:
    import subprocess
    import sys

    code = (
        "import sys, rollyard.sched; "
        "heavy = ('fastapi', 'sqlite3', 'aiohttp', 'torch', 'rollyard.gateway'); "
        "bad = [m for m in heavy if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_policy_spec_sets_parts_and_options_from_one_string() -> None:
    """``rollyard gateway --policy`` and ``rollyard sim -p`` take ``NAME,key=value,...``."""
    from rollyard.core.errors import ConfigError
    from rollyard.sched import AgingAdmission, ThunderAdmission
    from rollyard.sched.registry import policy_from_spec

    p = policy_from_spec("rollyard, max_hold_s=20, min_run_s=30, tick_s=0.5")
    assert isinstance(p.admission, AgingAdmission)
    assert (p.admission.max_hold_s, p.admission.min_run_s, p.tick_s) == (20.0, 30.0, 0.5)
    assert policy_from_spec("thunder,order=seer").name == "thunder[fewest_tokens,thunder,seer]"
    off = policy_from_spec("thunder,acting_half_life_s=0").admission
    assert isinstance(off, ThunderAdmission) and not off.acting_decay  # "0" is off, not a truthy string
    for bad, why in [
        ("rollyard,bogus=1", "unknown scheduling option"),
        ("rollyard,max_hold_s", "is not key=value"),
        ("rollyard,max_hold_s=soon", "admission policy 'aging'"),
        ("rollyard,tick_s=x", "tick_s"),
        ("nope", "unknown scheduling policy"),
        ("", "unknown scheduling policy"),
    ]:
        with pytest.raises(ConfigError, match=why):
            policy_from_spec(bad)
