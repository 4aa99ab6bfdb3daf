"""ThunderAgent's policy under a fake clock: pause acting-first smallest-first, restore
reasoning > new > acting on any engine, new programs wait behind paused ones, engine death,
a disconnect mid-stream, and the starvation it is known for."""

from __future__ import annotations

import pytest

from rollyard.core.clock import FakeClock
from rollyard.sched import Pause, Restore, Scheduler, make_policy


def thunder(
    *engines: tuple[str, int], policy: str = "thunder", **options: object
) -> tuple[Scheduler, FakeClock]:
    clock = FakeClock()
    s = Scheduler(clock, make_policy(policy, buffer_tokens=0, **options))
    for name, kv in engines:
        s.add_engine(name, capacity=64, kv_capacity_tokens=kv)
    return s, clock


def turn(s: Scheduler, rid: str, pid: str, prompt: int) -> None:
    """Submit one request, start it, finish it: the program is then acting with ``prompt`` context."""
    s.submit(rid, pid, prompt)
    assert [d.request_id for d in s.dispatch()] == [rid]
    s.complete(rid, 10)


def test_over_capacity_pauses_acting_programs_smallest_first_until_it_fits() -> None:
    s, clock = thunder(("e", 1000))
    for i, c in enumerate((200, 300, 400)):
        turn(s, f"r{i}", f"p{i}", c)
    for i, c in enumerate((300, 400, 500)):  # contexts grew after the turn: 1200 > 1000
        s.observe(f"p{i}", context_tokens=c)
    s.submit("r2b", "p2", 500)  # p2 reasons again; p0 and p1 act
    clock.advance(5)
    assert s.tick() == [Pause("p0", "e")]  # 300 frees enough; p1 is left alone
    assert s.state.programs["p0"].paused and s.state.programs["p0"].pauses == 1


def test_reasoning_programs_are_paused_only_when_acting_ones_do_not_suffice() -> None:
    s, _ = thunder(("e", 1000))
    turn(s, "a", "small_actor", 100)
    for pid, c in (("r1", 400), ("r2", 300)):
        s.submit(pid, pid, c)
    s.dispatch()
    s.observe("r1", context_tokens=600)
    s.observe("r2", context_tokens=500)  # 1200 total, 200 over
    decisions = s.tick()
    assert decisions == [Pause("small_actor", "e"), Pause("r2", "e")]


def test_a_paused_programs_next_request_is_held_and_restored_when_room_frees() -> None:
    s, clock = thunder(("e", 1000))
    turn(s, "r0", "small", 300)
    turn(s, "r1", "big", 600)
    s.observe("big", context_tokens=800)
    assert s.tick() == [Pause("small", "e")]
    s.submit("r2", "small", 310)
    assert s.dispatch() == []  # held in the gateway
    s.forget("big")  # it terminated: its KV is free
    clock.advance(5)
    assert s.tick() == [Restore("small", "e", 5.0)]
    assert [d.request_id for d in s.dispatch()] == ["r2"]


def test_restore_order_is_reasoning_then_new_then_acting_smallest_first() -> None:
    s, clock = thunder(("e", 1000))
    turn(s, "a", "hog", 900)
    # three programs that already ran a turn elsewhere, paused by an earlier tick
    for pid, c in (("reason_big", 300), ("reason_small", 200), ("actor", 100)):
        v = s.register(pid, context_tokens=c)
        v.turns = 1
        s.state.programs[pid].state = s.state.programs[pid].state.PAUSED
    s.submit("rb", "reason_big", 300)
    s.submit("rs", "reason_small", 200)
    s.submit("n", "newcomer", 150)  # a new program waits while anyone is paused
    assert s.dispatch() == []
    s.forget("hog")
    clock.advance(5)
    restored = [d.program_id for d in s.tick() if isinstance(d, Restore)]
    assert restored == ["reason_small", "reason_big", "newcomer", "actor"]


def test_a_restored_program_may_land_on_any_engine_the_one_with_most_room() -> None:
    s, clock = thunder(("a", 1000), ("b", 1000))
    turn(s, "r0", "p", 400)  # lands on a (ties: fewest tokens, then name)
    assert s.state.programs["p"].engine == "a"
    turn(s, "r1", "q", 400)
    assert s.state.programs["q"].engine == "b"
    s.observe("p", context_tokens=1100)
    assert s.tick() == [Pause("p", "a")]
    s.observe("p", context_tokens=500)  # say context management shrank it
    clock.advance(5)
    assert s.tick() == [Restore("p", "a", 5.0)]  # a is empty: most room


def test_new_programs_go_to_the_engine_with_fewest_active_tokens() -> None:
    s, _ = thunder(("a", 10_000), ("b", 10_000))
    turn(s, "r0", "p", 3000)
    turn(s, "r1", "q", 100)
    turn(s, "r2", "x", 50)
    assert (s.state.programs["q"].engine, s.state.programs["x"].engine) == ("b", "b")


def test_a_program_that_fits_nowhere_waits_and_is_forced_after_the_hold_bound() -> None:
    s, clock = thunder(("e", 1000), max_hold_s=60)
    turn(s, "r0", "hog", 900)
    s.submit("r1", "late", 500)
    assert s.dispatch() == []
    clock.advance(59)
    assert s.tick() == []
    clock.advance(1)
    assert s.tick() == [Restore("late", "e", 60.0), Pause("hog", "e")]  # then the acting hog makes room
    assert [d.request_id for d in s.dispatch()] == ["r1"]


@pytest.mark.parametrize("policy", ["thunder", "rollyard"])
def test_a_dead_engines_paused_program_is_restored_on_a_live_one(policy: str) -> None:
    s, clock = thunder(("a", 1000), ("b", 1000), policy=policy)
    turn(s, "r0", "p", 900)
    turn(s, "r1", "q", 100)
    s.observe("p", context_tokens=1200)
    assert s.tick() == [Pause("p", "a")]
    s.submit("r2", "p", 1200)
    s.engine_down("a")
    s.observe("p", context_tokens=800)
    clock.advance(5)
    assert s.tick() == [Restore("p", "b", 5.0)]
    start = s.dispatch()[0]
    assert (start.engine, start.moved_from) == ("b", "a")


@pytest.mark.parametrize("policy", ["thunder", "rollyard"])
def test_a_program_that_disconnects_mid_stream_is_acting_and_paused_first(policy: str) -> None:
    s, _ = thunder(("e", 1000), policy=policy)
    s.submit("r0", "gone", 300)
    s.submit("r1", "busy", 600)
    s.dispatch()
    s.cancel("r0")  # the client went away while its request ran
    assert s.state.programs["gone"].phase == "acting"
    s.observe("busy", context_tokens=800)
    assert s.tick() == [Pause("gone", "e")]


def test_acting_tokens_decay_makes_restores_optimistic() -> None:
    s, clock = thunder(("e", 1000), acting_half_life_s=1.0)
    turn(s, "r0", "actor", 800)
    v = s.register("waiting", context_tokens=400)
    v.turns = 1
    v.state = v.state.PAUSED
    s.submit("r1", "waiting", 400)
    assert s.tick() == []  # 800 + 400 > 1000 right after the turn
    clock.advance(2)  # the actor's tokens count a quarter now
    assert [d.program_id for d in s.tick()] == ["waiting", "actor"]  # restored, then over: actor paused


def long_program_wait(policy: str, rounds: int = 20) -> float | None:
    """A resident program keeps 350 of 1000 KV tokens; a 600-token program waits while a
    100-token program arrives every 5 s and runs briefly. When does the long one start?"""
    clock = FakeClock()
    s = Scheduler(clock, make_policy(policy, buffer_tokens=0))
    s.add_engine("e", capacity=64, kv_capacity_tokens=1000)
    turn(s, "h", "resident", 350)
    s.submit("s-1", "short-1", 100)
    s.dispatch()
    s.submit("long", "long", 600)  # 350 + 100 + 600 > 1000: it waits
    assert s.dispatch() == []
    for i in range(rounds):
        s.submit(f"s{i}", f"short{i}", 100)
        s.complete(f"s{i - 1}", 10)
        s.forget(f"short{i - 1}")
        clock.advance(5)
        s.tick()
        for d in s.dispatch():
            if d.request_id == "long":
                return d.waited_s
    return None


def test_thunder_starves_a_long_program_behind_a_stream_of_short_ones() -> None:
    """Their issues #45/#46: smallest-first restore picks every short newcomer first, and the
    long program never fits beside it (only the 1800 s forced resume would start it)."""
    assert long_program_wait("thunder") is None


def test_rollyard_ages_the_long_program_to_the_front() -> None:
    waited = long_program_wait("rollyard")
    assert waited is not None and waited <= 15.0


def test_kv_tokens_caps_the_capacity_the_policy_plans_with() -> None:
    """An engine reporting 1000 tokens, planned at 700: the same contexts are over capacity."""
    s, _ = thunder(("e", 1000), kv_tokens=700)
    turn(s, "r0", "p0", 300)
    turn(s, "r1", "p1", 300)
    s.observe("p1", context_tokens=500)
    assert s.tick() == [Pause("p0", "e")]  # 800 > 700, not > 1000
    wide, _ = thunder(("e", 1000), kv_tokens=5000)  # a cap above the engine changes nothing
    turn(wide, "r0", "p0", 600)
    turn(wide, "r1", "p1", 300)
    assert wide.tick() == []
    wide.observe("p1", context_tokens=500)
    assert wide.tick() == [Pause("p1", "e")]  # 1100 > 1000: the engine's own capacity holds
