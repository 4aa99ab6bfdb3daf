"""The EnginePool shell around a pausing policy: it feeds engine stats into the views,
carries out pauses and restores, holds paused programs' requests, and counts it all."""

from __future__ import annotations

import asyncio

from rollyard.core.clock import FakeClock
from rollyard.engines.base import EngineStats
from rollyard.gateway.metrics import GatewayMetrics
from rollyard.gateway.pool import EnginePool
from rollyard.sched import Pause, Restore, Scheduler, make_policy


class StatsOnly:
    """A backend that only answers ``stats`` (the pool never generates)."""

    def __init__(self, name: str) -> None:
        self.name, self.max_model_len = name, 4096
        self.stats_now = EngineStats()

    async def stats(self) -> EngineStats:
        return self.stats_now

    async def aclose(self) -> None: ...


def sample(metrics: GatewayMetrics, name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.registry.get_sample_value(name, labels or {}) or 0.0


def test_refresh_feeds_kv_capacity_queue_and_measured_prefill_rate() -> None:
    async def go() -> None:
        b = StatsOnly("e")
        pool = EnginePool({"e": b}, Scheduler(FakeClock(), make_policy("rollyard")), GatewayMetrics())
        b.stats_now = EngineStats(kv_capacity_tokens=4096, waiting=3, prefill_tokens=100, prefill_s=1.0)
        await pool.refresh()
        b.stats_now = EngineStats(kv_capacity_tokens=4096, waiting=3, prefill_tokens=1100, prefill_s=3.0)
        await pool.refresh()
        e = pool.scheduler.state.engines["e"]
        assert (e.kv_capacity_tokens, e.waiting, e.prefill_tok_s) == (4096, 3, 500.0)

    asyncio.run(go())


def test_pauses_hold_requests_and_restores_release_them_with_metrics() -> None:
    async def go() -> None:
        clock = FakeClock()
        metrics = GatewayMetrics()
        b = StatsOnly("e")
        b.stats_now = EngineStats(kv_capacity_tokens=1000)
        pool = EnginePool({"e": b}, Scheduler(clock, make_policy("thunder", buffer_tokens=0)), metrics)
        await pool.refresh()
        seen: list[Pause | Restore] = []
        pool.on_decision(seen.append)
        first = await pool.acquire("p", 600)
        pool.release(first, 5)
        pool.scheduler.observe("p", context_tokens=1200)  # its context grew past the engine's KV
        assert pool.tick() == [Pause("p", "e")]
        held = asyncio.ensure_future(pool.acquire("p", 1200))
        await asyncio.sleep(0)
        assert not held.done()
        pool.observe_metrics()  # what GET /metrics does
        assert sample(metrics, "rollyard_sched_programs", {"state": "paused", "phase": "reasoning"}) == 1
        pool.scheduler.observe("p", context_tokens=900)  # say the agent compacted its context
        clock.advance(5)
        assert pool.tick() == [Restore("p", "e", 5.0)]
        start = await asyncio.wait_for(held, 1)
        assert start.waited_s == 5.0
        assert seen == [Pause("p", "e"), Restore("p", "e", 5.0)]
        assert sample(metrics, "rollyard_sched_pauses_total") == 1
        assert sample(metrics, "rollyard_sched_restores_total") == 1
        assert sample(metrics, "rollyard_sched_hold_seconds_count") == 1
        assert sample(metrics, "rollyard_sched_active_tokens", {"engine": "e"}) == 900

    asyncio.run(go())


def test_a_program_that_ends_hands_its_kv_to_a_paused_one_without_waiting_for_a_tick() -> None:
    """rollyard restores on release: the held request starts when the room appears, counted and
    mirrored as a tick's restore is; thunder keeps ThunderAgent's periodic tick only."""

    async def go(policy: str) -> bool:
        clock = FakeClock()
        metrics = GatewayMetrics()
        b = StatsOnly("e")
        b.stats_now = EngineStats(kv_capacity_tokens=1000)
        pool = EnginePool({"e": b}, Scheduler(clock, make_policy(policy, buffer_tokens=0)), metrics)
        await pool.refresh()
        seen: list[Pause | Restore] = []
        pool.on_decision(seen.append)
        pool.release(await pool.acquire("small", 300), 5)
        pool.release(await pool.acquire("big", 600), 5)
        pool.scheduler.observe("big", context_tokens=800)  # 300 + 800 > 1000
        assert pool.tick() == [Pause("small", "e")]
        held = asyncio.ensure_future(pool.acquire("small", 310))
        await asyncio.sleep(0)
        assert not held.done()
        clock.advance(2)
        pool.forget("big")  # it finished: what the gateway's terminate hook calls
        await asyncio.sleep(0)
        if not held.done():
            held.cancel()
            return False
        assert seen == [Pause("small", "e"), Restore("small", "e", 2.0)]
        assert pool.counts["restores"] == 1
        assert sample(metrics, "rollyard_sched_restores_total") == 1
        return True

    assert asyncio.run(go("rollyard")) is True
    assert asyncio.run(go("thunder")) is False  # held until its next tick


async def _s_restored_from_a_to_b() -> tuple[GatewayMetrics, EnginePool]:
    """Two engines of 1,000 KV tokens under ``thunder``: p and s on a, q on b; p grows, so s is
    paused on a and restored on b, the only engine with room for it (not run there yet)."""
    clock = FakeClock()
    metrics = GatewayMetrics()
    backends = {n: StatsOnly(n) for n in ("a", "b")}
    for b in backends.values():
        b.stats_now = EngineStats(kv_capacity_tokens=1000)
    pool = EnginePool(backends, Scheduler(clock, make_policy("thunder", buffer_tokens=0)), metrics)
    await pool.refresh()
    for pid, tokens in (("p", 100), ("q", 300), ("s", 150)):
        pool.release(await pool.acquire(pid, tokens), 5)
    programs = pool.scheduler.state.programs
    assert [programs[p].engine for p in "pqs"] == ["a", "b", "a"]
    pool.scheduler.observe("p", context_tokens=900)  # a: 900 + 150 > 1000
    assert pool.tick() == [Pause("s", "a")]
    clock.advance(1)
    assert pool.tick() == [Restore("s", "b", 1.0)]
    return metrics, pool


def test_a_restore_onto_another_engine_is_counted_as_a_restore_move_and_a_dead_engine_as_replaced() -> None:
    async def go() -> None:
        metrics, pool = await _s_restored_from_a_to_b()
        start = await pool.acquire("s", 160)
        assert (start.engine, start.moved_from) == ("b", "a")
        assert sample(metrics, "rollyard_sched_moves_total", {"why": "restore"}) == 1
        assert sample(metrics, "rollyard_sched_moves_total", {"why": "replaced"}) == 0
        pool.release(start, 5)
        pool.release(await pool.acquire("s", 170), 5)  # its own engine now: no move
        pool.forget("p")
        pool.mark_down("b", "test")
        start = await pool.acquire("q", 310)
        assert (start.engine, start.moved_from) == ("a", "b")
        assert sample(metrics, "rollyard_sched_moves_total", {"why": "replaced"}) == 1
        assert sample(metrics, "rollyard_sched_moves_total", {"why": "restore"}) == 1
        assert pool.counts["moves"] == 2 and pool.counts["pool_restores"] == 0

    asyncio.run(go())


def test_a_restored_program_whose_new_engine_dies_before_it_runs_is_counted_as_replaced() -> None:
    async def go() -> None:
        metrics, pool = await _s_restored_from_a_to_b()
        pool.forget("p")  # room on a again
        pool.mark_down("b", "test")  # s's new engine dies before s's next request
        start = await pool.acquire("s", 160)
        assert start.engine == "a" and start.moved_from is not None
        assert sample(metrics, "rollyard_sched_moves_total", {"why": "replaced"}) == 1
        assert sample(metrics, "rollyard_sched_moves_total", {"why": "restore"}) == 0

    asyncio.run(go())
