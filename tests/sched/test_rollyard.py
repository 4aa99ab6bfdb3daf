"""The rollyard policy under a fake clock: bounded hold, warm-engine restores, anti-thrash
pausing, cost-aware moves, vLLM priorities, and the registry's names."""

from __future__ import annotations

import pytest

from rollyard.core.clock import FakeClock
from rollyard.core.errors import ConfigError
from rollyard.sched import Move, Pause, Restore, Scheduler, make_policy, policy_names


def rollyard(*engines: tuple[str, int], **options: object) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    s = Scheduler(clock, make_policy("rollyard", buffer_tokens=0, **options))
    for name, kv in engines:
        s.add_engine(name, capacity=4, kv_capacity_tokens=kv)
    return s, clock


def turn(s: Scheduler, rid: str, pid: str, prompt: int) -> None:
    s.submit(rid, pid, prompt)
    assert [d.request_id for d in s.dispatch()] == [rid]
    s.complete(rid, 10)


def test_presets_and_their_parts_are_listed_and_unknown_options_are_a_clear_error() -> None:
    assert {"fifo", "thunder", "rollyard"} <= set(policy_names())
    p = make_policy("rollyard")
    assert (p.name, p.tick_s, p.admission.max_hold_s) == ("rollyard", 1.0, 30.0)
    assert make_policy("thunder").tick_s == 5.0
    assert make_policy("thunder", max_hold_s=10).admission.max_hold_s == 10.0
    with pytest.raises(ConfigError, match="max_hold"):
        make_policy("rollyard", max_hold=3)


def test_no_request_is_held_longer_than_the_bound() -> None:
    s, clock = rollyard(("e", 1000), max_hold_s=30, reserve_after_s=1000)
    turn(s, "r0", "hog", 950)
    s.submit("r1", "late", 400)
    for _ in range(29):
        clock.advance(1)
        assert not [d for d in s.tick() if isinstance(d, Restore)]
    clock.advance(1)
    assert Restore("late", "e", 30.0) in s.tick()
    assert s.dispatch()[0].waited_s == 30.0


def test_an_overdue_program_blocks_newer_small_ones_until_it_fits() -> None:
    s, clock = rollyard(("e", 1000), reserve_after_s=10)
    s.submit("r0", "resident", 500)
    s.dispatch()  # its request is running: it cannot be paused to make room
    s.submit("r1", "long", 600)
    clock.advance(10)
    s.submit("r2", "small", 100)  # would fit, but the long program is overdue
    clock.advance(1)
    assert s.tick() == []
    s.complete("r0", 10)
    s.forget("resident")
    clock.advance(1)
    assert [d.program_id for d in s.tick()] == ["long", "small"]


def test_acting_programs_are_paused_to_make_room_for_an_overdue_one() -> None:
    s, clock = rollyard(("e", 1000), reserve_after_s=10)
    turn(s, "r0", "actor_big", 300)  # both act (their tools run): nothing of theirs is in flight
    turn(s, "r1", "actor_small", 200)
    s.submit("r2", "long", 600)
    clock.advance(5)
    assert s.tick() == []  # not overdue yet: thunder's order, it does not fit
    clock.advance(5)
    out = s.tick()
    assert out == [Pause("actor_small", "e", "make_room"), Restore("long", "e", 10.0)]
    assert s.dispatch()[0].request_id == "r2"


def test_the_reserve_time_and_recent_restores_follow_the_engines_request_time() -> None:
    """On an engine whose requests take 12 s, a program held 10 s is not overdue yet (with a
    fixed 10 s it would be, and acting programs would be paused for it), and a program
    restored 20 s ago still counts as recent (2 requests)."""
    s, clock = rollyard(("e", 1000), reserve_after_s=10, min_run_s=5)
    turn(s, "r0", "actor_big", 300)
    turn(s, "r1", "actor_small", 200)
    s.state.engines["e"].service_s = 12.0  # what Scheduler.complete measures
    s.submit("r2", "long", 600)
    clock.advance(10)
    assert s.tick() == []
    clock.advance(2)
    assert s.tick() == [Pause("actor_small", "e", "make_room"), Restore("long", "e", 12.0)]
    assert s.dispatch()[0].request_id == "r2"
    s.complete("r2", 10)  # both act now
    s.state.engines["e"].service_s = 12.0
    clock.advance(20)  # "long" was restored 20 s ago: recent under 2 x 12 s, not under 5 s
    s.observe("actor_big", context_tokens=700)  # 700 + 600 > 1000: one must go
    assert [d for d in s.tick() if isinstance(d, Pause)] == [Pause("actor_big", "e")]  # not the smaller


def test_a_restored_program_returns_to_the_engine_that_caches_its_prefix() -> None:
    s, clock = rollyard(("a", 1000), ("b", 1000))
    turn(s, "r0", "p", 500)
    turn(s, "r1", "q", 100)
    assert (s.state.programs["p"].engine, s.state.programs["q"].engine) == ("a", "b")
    s.observe("p", context_tokens=1100)
    assert s.tick() == [Pause("p", "a")]
    s.observe("p", context_tokens=700)
    clock.advance(1)
    assert s.tick() == [Restore("p", "a", 1.0)]  # b has more room, a has its cache


def test_recently_restored_programs_are_paused_last() -> None:
    s, clock = rollyard(("e", 1000), min_run_s=5)
    turn(s, "r0", "a", 200)
    turn(s, "r1", "b", 300)
    s.state.programs["a"].restored_at = clock.now()
    s.observe("b", context_tokens=900)  # 1100: one must go; thunder would pick a (smaller)
    assert s.tick() == [Pause("b", "e")]


def test_a_program_larger_than_every_engine_is_not_held_for_nothing() -> None:
    s, clock = rollyard(("e", 1000))
    s.submit("r0", "huge", 1500)
    clock.advance(1)
    assert s.tick() == [Restore("huge", "e", 1.0)]
    assert s.dispatch()[0].request_id == "r0"


def two_engines(prefill_tok_s: float, context: int) -> tuple[Scheduler, FakeClock]:
    """Program p is sticky on a, whose engine queue is long; b is idle."""
    s, clock = rollyard(("a", 100_000), ("b", 100_000))
    turn(s, "r0", "p", context)
    s.submit("r1", "q", 10)
    assert s.dispatch()[0].engine == "b"
    clock.advance(2.0)  # q's request took 2 s on b
    s.complete("r1", 10)
    s.forget("q")
    for e in ("a", "b"):
        s.state.engines[e].service_s = 2.0
    s.update_engine("a", waiting=8)
    s.update_engine("b", prefill_tok_s=prefill_tok_s)
    return s, clock


def test_a_sticky_program_moves_when_its_queue_costs_more_than_re_prefill() -> None:
    s, _ = two_engines(prefill_tok_s=1000.0, context=2000)  # re-prefill 2 s < 8 waiting x 2 s
    s.submit("r2", "p", 2000)
    out = s.dispatch()
    assert isinstance(out[0], Move) and (out[0].src, out[0].dst) == ("a", "b")
    assert (out[1].engine, out[1].moved_from) == ("b", "a")


def test_a_sticky_program_stays_when_re_prefill_costs_more_than_the_queue() -> None:
    s, _ = two_engines(prefill_tok_s=50.0, context=2000)  # re-prefill 40 s > 16 s queue
    s.submit("r2", "p", 2000)
    out = s.dispatch()
    assert [type(d).__name__ for d in out] == ["Start"] and out[0].engine == "a"


def test_no_move_without_a_measured_prefill_rate() -> None:
    s, _ = two_engines(prefill_tok_s=0.0, context=10)
    s.submit("r2", "p", 10)
    assert s.dispatch()[0].engine == "a"


def test_the_scheduler_measures_per_engine_service_time() -> None:
    s, clock = rollyard(("e", 1000))
    s.submit("r0", "p", 10)
    s.dispatch()
    clock.advance(3.0)
    s.complete("r0", 5)
    assert s.state.engines["e"].service_s == 3.0


def test_room_released_between_ticks_is_handed_out_at_once() -> None:
    """A paused program's held request is restored when a program ends or a running request
    of a paused program finishes, not up to ``tick_s`` later (``Scheduler.admit``)."""
    s, clock = rollyard(("e", 1000))
    assert s.policy.on_release and not make_policy("thunder").on_release
    turn(s, "r0", "small", 300)
    turn(s, "r1", "big", 600)
    s.observe("big", context_tokens=800)
    assert s.tick() == [Pause("small", "e")]
    s.submit("r2", "small", 310)
    assert not s.admission_due()  # nothing was released (a finished turn only grows a claim)
    clock.advance(0.5)
    s.forget("big")
    assert s.admission_due()
    assert s.admit() == [Restore("small", "e", 0.5)]
    assert [d.request_id for d in s.dispatch()] == ["r2"]
    assert not s.admission_due()
