"""The pool: sandboxes prepared ahead, bound to programs, destroyed by hook or deadline."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from rollyard.core.clock import FakeClock
from rollyard.core.errors import Conflict, NotFound, SandboxError
from rollyard.sandbox import ExecResult, SandboxSpec
from rollyard.sandbox._uids import processes_of
from rollyard.sandbox.bwrap import BwrapProvider
from rollyard.sandbox.pool import Binding, SandboxPool, expired


class _FakeSandbox:
    def __init__(self, n: int, spec: SandboxSpec) -> None:
        self.id, self.spec, self.closed, self.leaked = f"fake{n}", spec, False, 0

    async def exec(self, cmd: object, *, timeout: float | None = None, env: object = None) -> ExecResult:
        return ExecResult(rc=0, stdout="", stderr="")

    async def close(self) -> None:
        self.closed = True


class _FakeProvider:
    """Counts creations; for the pool's own bookkeeping, which does not depend on isolation."""

    name = "fake"

    def __init__(self) -> None:
        self.made: list[_FakeSandbox] = []
        self.fail = False

    async def create(self, spec: SandboxSpec) -> _FakeSandbox:
        await asyncio.sleep(0)
        if self.fail:
            raise SandboxError("cannot create")
        sb = _FakeSandbox(len(self.made), spec)
        self.made.append(sb)
        return sb


async def _settle(pool: SandboxPool) -> None:
    for _ in range(20):
        await asyncio.sleep(0)
    while pool._bg:
        await asyncio.gather(*list(pool._bg))


async def test_registering_a_task_prepares_sandboxes_ahead_and_acquire_refills() -> None:
    prov = _FakeProvider()
    pool = SandboxPool(prov, ahead=2, reap_interval_s=0)
    prepared: list[str] = []

    async def setup(sb: object) -> None:
        prepared.append(sb.id)  # type: ignore[attr-defined]

    pool.register("t1", SandboxSpec(label="t1"), prepare=setup)
    await _settle(pool)
    assert pool.stats.prepared == 2 and len(prov.made) == 2 and len(prepared) == 2
    sb = await pool.acquire("t1", "p1")
    assert sb.id in prepared and pool.stats.in_use == 1
    await _settle(pool)
    assert pool.stats.prepared == 2 and len(prov.made) == 3
    await pool.close()
    assert all(s.closed for s in prov.made)


async def test_the_termination_hook_destroys_the_bound_sandbox_from_any_thread() -> None:
    prov = _FakeProvider()
    pool = SandboxPool(prov, ahead=0, reap_interval_s=0)
    pool.register("t", SandboxSpec())
    a = await pool.acquire("t", "pa")
    b = await pool.acquire("t", "pb")
    pool.on_program_terminated("pa")
    await _settle(pool)
    assert a.closed and not b.closed  # type: ignore[attr-defined]
    th = threading.Thread(target=pool.on_program_terminated, args=("pb",))
    th.start()
    th.join()
    for _ in range(100):
        if b.closed:  # type: ignore[attr-defined]
            break
        await asyncio.sleep(0.01)
    assert b.closed and pool.stats.in_use == 0  # type: ignore[attr-defined]
    pool.on_program_terminated("unknown")  # a second or unknown call is harmless
    await pool.close()


async def test_deadlines_are_reaped_in_order_by_the_injected_clock() -> None:
    clock = FakeClock()
    pool = SandboxPool(_FakeProvider(), ahead=0, clock=clock, deadline_s=10, reap_interval_s=0)
    pool.register("t", SandboxSpec())
    await pool.acquire("t", "late", deadline_s=5)
    await pool.acquire("t", "default")
    await pool.acquire("t", "never", deadline_s=1e9)
    clock.advance(4)
    assert await pool.reap() == []
    clock.advance(7)
    assert await pool.reap() == ["late", "default"]
    assert pool.sandbox_of("never") is not None and pool.stats.in_use == 1
    await pool.close()


def test_expired_lists_only_passed_deadlines_earliest_first() -> None:
    s = object()
    bs = {
        "a": Binding("a", "t", s, 5.0),  # type: ignore[arg-type]
        "b": Binding("b", "t", s, 2.0),  # type: ignore[arg-type]
        "c": Binding("c", "t", s, None),  # type: ignore[arg-type]
        "d": Binding("d", "t", s, 9.0),  # type: ignore[arg-type]
    }
    assert expired(bs, 5.0) == ["b", "a"]
    assert expired(bs, 1.0) == []


async def test_bad_calls_get_typed_errors_and_failures_are_counted() -> None:
    prov = _FakeProvider()
    pool = SandboxPool(prov, ahead=1, reap_interval_s=0)
    with pytest.raises(NotFound):
        await pool.acquire("nope", "p")
    pool.register("t", SandboxSpec())
    await pool.acquire("t", "p")
    with pytest.raises(Conflict):
        await pool.acquire("t", "p")
    prov.fail = True
    await pool.release("p")
    await _settle(pool)
    with pytest.raises(SandboxError):
        await pool.acquire("t", "q")
    await _settle(pool)
    assert pool.stats.prepare_failures >= 1
    await pool.close()
    with pytest.raises(SandboxError, match="closed"):
        await pool.acquire("t", "r")


async def test_metrics_are_exported_to_the_given_registry() -> None:
    reg = CollectorRegistry()
    pool = SandboxPool(_FakeProvider(), ahead=1, registry=reg, reap_interval_s=0)
    pool.register("t", SandboxSpec())
    await _settle(pool)
    await pool.acquire("t", "p")
    await _settle(pool)
    assert reg.get_sample_value("rollyard_sandbox_in_use") == 1
    assert reg.get_sample_value("rollyard_sandbox_prepared") == 1
    assert reg.get_sample_value("rollyard_sandbox_prepare_seconds_count") == 2
    await pool.close()
    assert reg.get_sample_value("rollyard_sandbox_destroyed_total") == 2
    assert reg.get_sample_value("rollyard_sandbox_leaks_total") == 0


async def test_32_concurrent_programs_on_real_sandboxes_leave_nothing_behind(
    provider: BwrapProvider, sandbox_root: Path
) -> None:
    pool = SandboxPool(provider, ahead=4, reap_interval_s=0)

    async def setup(sb: object) -> None:
        await sb.write("task.txt", "42")  # type: ignore[attr-defined]

    pool.register("t", SandboxSpec(), prepare=setup)
    uids: list[int] = []

    async def program(i: int) -> str:
        sb = await pool.acquire("t", f"p{i}")
        uids.append(sb.uid)  # type: ignore[attr-defined]
        r = await sb.exec(["sh", "-c", "cat task.txt; sleep 0.2 &"])
        pool.on_program_terminated(f"p{i}")
        return r.stdout

    outs = await asyncio.gather(*(program(i) for i in range(32)))
    assert outs == ["42"] * 32
    assert len(set(uids)) == 32  # every live sandbox has its own uid
    await pool.close()
    assert pool.stats.leaks == 0 and pool.stats.in_use == 0 and pool.stats.prepared == 0
    assert all(processes_of(u) == [] for u in uids)
    assert [p.name for p in sandbox_root.iterdir() if not p.name.startswith(".etc-")] == []
