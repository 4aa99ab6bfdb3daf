"""Prepared sandboxes ahead of demand, bound to programs and destroyed when they end.

Preparation (create + the task's setup) is what makes a rollout wait, so the pool keeps ``ahead``
ready sandboxes per task, refilled by background tasks. A sandbox is bound to one program; the
gateway or orchestrator calls ``on_program_terminated(program_id)`` (a plain callback, safe from any
thread), or the deadline passes, and the sandbox is closed: no process, mount or file remains,
which the provider reports as ``leaked`` and the pool counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from rollyard.core.clock import Clock, SystemClock
from rollyard.core.errors import Conflict, NotFound, SandboxError
from rollyard.sandbox.base import Sandbox, SandboxProvider, SandboxSpec

log = logging.getLogger(__name__)

Prepare = Callable[[Sandbox], Awaitable[None]]


@dataclass
class _Task:
    spec: SandboxSpec
    prepare: Prepare | None
    ahead: int
    ready: deque[Sandbox] = field(default_factory=deque)
    preparing: int = 0


@dataclass
class Binding:
    program_id: str
    task_key: str
    sandbox: Sandbox
    deadline: float | None  # clock time after which the reaper destroys it


def expired(bindings: dict[str, Binding], now: float) -> list[str]:
    """Program ids whose deadline has passed, earliest first (the reaper's whole decision)."""
    late = [b for b in bindings.values() if b.deadline is not None and b.deadline <= now]
    return [b.program_id for b in sorted(late, key=lambda b: b.deadline or 0.0)]


@dataclass
class PoolStats:
    prepared: int = 0
    in_use: int = 0
    created: int = 0
    destroyed: int = 0
    leaks: int = 0
    prepare_failures: int = 0
    prepare_seconds_sum: float = 0.0
    hook_releases: int = 0  # sandboxes freed by the program-terminated hook
    ahead_hits: int = 0  # acquires served by a sandbox prepared ahead


class _Metrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.on = registry is not None
        if registry is None:
            return
        p = "rollyard_sandbox_"
        self.prepared = Gauge(p + "prepared", "sandboxes ready for a program", registry=registry)
        self.in_use = Gauge(p + "in_use", "sandboxes bound to a program", registry=registry)
        self.latency = Histogram(p + "prepare_seconds", "create + setup time", registry=registry)
        self.leaks = Counter(p + "leaks", "processes or files left after a close", registry=registry)
        self.destroyed = Counter(p + "destroyed", "sandboxes closed", registry=registry)


class SandboxPool:
    def __init__(
        self,
        provider: SandboxProvider,
        *,
        ahead: int = 2,
        clock: Clock | None = None,
        registry: CollectorRegistry | None = None,
        deadline_s: float | None = None,
        reap_interval_s: float = 1.0,
    ) -> None:
        if ahead < 0:
            raise SandboxError("ahead must be >= 0")
        self.provider = provider
        self.ahead = ahead
        self.clock = clock or SystemClock()
        self.deadline_s = deadline_s
        self.reap_interval_s = reap_interval_s
        self.stats = PoolStats()
        self._m = _Metrics(registry)
        self._tasks: dict[str, _Task] = {}
        self._bound: dict[str, Binding] = {}
        self._bg: set[asyncio.Future[object]] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._closed = False

    # -- task registry and preparation -------------------------------------------------------
    def register(
        self, task_key: str, spec: SandboxSpec, prepare: Prepare | None = None, ahead: int | None = None
    ) -> None:
        """Declare how a task's sandboxes are made and start preparing ``ahead`` of them."""
        self._check_open()
        self._loop = asyncio.get_running_loop()
        self._tasks[task_key] = _Task(spec, prepare, self.ahead if ahead is None else ahead)
        self._refill(task_key)
        if self._reaper is None and self.reap_interval_s > 0:
            self._reaper = asyncio.ensure_future(self._reap_loop())

    def _refill(self, task_key: str) -> None:
        t = self._tasks.get(task_key)
        while t is not None and not self._closed and len(t.ready) + t.preparing < t.ahead:
            t.preparing += 1
            self._spawn(self._prepare_ahead(task_key, t))

    async def _make(self, t: _Task) -> Sandbox:
        t0 = self.clock.now()
        sb = await self.provider.create(t.spec)
        try:
            if t.prepare is not None:
                await t.prepare(sb)
        except BaseException:
            await self._destroy(sb)
            raise
        dt = self.clock.now() - t0
        self.stats.created += 1
        self.stats.prepare_seconds_sum += dt
        if self._m.on:
            self._m.latency.observe(dt)
        return sb

    async def _prepare_ahead(self, task_key: str, t: _Task) -> None:
        try:
            sb = await self._make(t)
        except Exception as e:
            self.stats.prepare_failures += 1
            log.warning("task=%s sandbox preparation failed: %s", task_key, e)
            return
        finally:
            t.preparing -= 1
        if self._closed or self._tasks.get(task_key) is not t:
            await self._destroy(sb)
            return
        t.ready.append(sb)
        self._gauges()

    # -- binding programs ---------------------------------------------------------------------
    async def acquire(self, task_key: str, program_id: str, *, deadline_s: float | None = None) -> Sandbox:
        """A prepared sandbox of ``task_key`` bound to ``program_id`` (made now if none is ready)."""
        self._check_open()
        t = self._tasks.get(task_key)
        if t is None:
            raise NotFound(f"unknown task {task_key!r}; register it with the pool first")
        if program_id in self._bound:
            raise Conflict(f"program {program_id} already has a sandbox")
        sb = t.ready.popleft() if t.ready else None
        self.stats.ahead_hits += sb is not None
        self._refill(task_key)
        if sb is None:
            sb = await self._make(t)
        if program_id in self._bound or self._closed:  # lost a race while preparing
            await self._destroy(sb)
            raise Conflict(f"program {program_id} already has a sandbox or the pool closed")
        limit = self.deadline_s if deadline_s is None else deadline_s
        deadline = None if limit is None else self.clock.now() + limit
        self._bound[program_id] = Binding(program_id, task_key, sb, deadline)
        self._gauges()
        return sb

    def sandbox_of(self, program_id: str) -> Sandbox | None:
        b = self._bound.get(program_id)
        return b.sandbox if b else None

    def on_program_terminated(self, program_id: str) -> None:
        """Hook for the gateway / orchestrator: the program ended, free its sandbox. Any thread."""
        if self._loop is None or self._loop.is_closed() or program_id not in self._bound:
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        self.stats.hook_releases += 1
        if running is self._loop:
            self._spawn(self.release(program_id))
        else:
            asyncio.run_coroutine_threadsafe(self.release(program_id), self._loop)

    async def release(self, program_id: str) -> bool:
        """Destroy the program's sandbox now; False if it had none."""
        b = self._bound.pop(program_id, None)
        if b is None:
            return False
        self._gauges()
        await self._destroy(b.sandbox)
        return True

    async def reap(self) -> list[str]:
        """Destroy every binding whose deadline has passed; returns their program ids."""
        ids = expired(self._bound, self.clock.now())
        for pid in ids:
            log.warning("program=%s sandbox deadline passed; destroying it", pid)
            await self.release(pid)
        return ids

    async def _reap_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.reap_interval_s)
            await self.reap()

    # -- teardown -----------------------------------------------------------------------------
    async def _destroy(self, sb: Sandbox) -> None:
        await sb.close()
        leaked = int(getattr(sb, "leaked", 0))
        self.stats.destroyed += 1
        self.stats.leaks += leaked
        if self._m.on:
            self._m.destroyed.inc()
            if leaked:
                self._m.leaks.inc(leaked)

    async def close(self) -> None:
        """Stop preparing, destroy every ready and bound sandbox, wait for background work."""
        if self._closed:
            return
        self._closed = True
        if self._reaper is not None:
            self._reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reaper
        while self._bg:
            await asyncio.gather(*list(self._bg), return_exceptions=True)
        for pid in list(self._bound):
            await self.release(pid)
        for t in self._tasks.values():
            while t.ready:
                await self._destroy(t.ready.popleft())
        self._gauges()

    def _spawn(self, coro: Awaitable[object]) -> None:
        fut = asyncio.ensure_future(coro)
        self._bg.add(fut)
        fut.add_done_callback(self._bg.discard)

    def _gauges(self) -> None:
        self.stats.prepared = sum(len(t.ready) for t in self._tasks.values())
        self.stats.in_use = len(self._bound)
        if self._m.on:
            self._m.prepared.set(self.stats.prepared)
            self._m.in_use.set(self.stats.in_use)

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox pool is closed")
