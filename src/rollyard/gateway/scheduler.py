"""Which request runs next, on which engine: a pure core with an injected clock and no I/O.

Requests enter a queue; ``dispatch()`` hands out as many as the engines have room for, in the
order the policy chooses. The shipped policy is FIFO with sticky routing: a program stays on
its engine (prefix-cache locality), a new program goes to the healthy engine with the lowest
KV usage (then fewest programs), and when an engine dies its programs are re-placed on the
next dispatch (the engine re-prefills from the full prompt ids the gateway always sends).

Next-wave policies (pause/restore, group-aware) implement ``Policy``; a simulator drives the
same ``Scheduler`` with a ``FakeClock``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from rollyard.core.clock import Clock
from rollyard.core.errors import EngineUnavailable, InvalidRequest


@dataclass
class EngineView:
    """What the scheduler knows of one engine (refreshed from its stats by the shell)."""

    name: str
    capacity: int = 256  # concurrent requests the gateway sends it
    kv_usage: float = 0.0
    healthy: bool = True
    in_flight: int = 0

    @property
    def free(self) -> int:
        return self.capacity - self.in_flight if self.healthy else 0


@dataclass
class Pending:
    request_id: str
    program_id: str
    prompt_tokens: int
    submitted_at: float


@dataclass(frozen=True)
class Dispatch:
    request_id: str
    program_id: str
    engine: str
    moved_from: str | None  # the dead engine this program was moved away from, if any
    waited_s: float


@dataclass
class SchedulerState:
    """Everything a policy may read; policies never mutate it."""

    engines: dict[str, EngineView]
    placement: dict[str, str]  # program id -> engine
    programs_on: dict[str, int] = field(default_factory=dict)


class Policy(Protocol):
    def order(self, queue: deque[Pending], state: SchedulerState, now: float) -> list[Pending]:
        """The queued requests in the order they should be tried."""
        ...

    def place(self, program_id: str, state: SchedulerState) -> str | None:
        """The engine for a program without a (healthy) placement; None when none has room."""
        ...


class FifoSticky:
    """First come, first served; sticky engines; new programs to the least-loaded engine."""

    def order(self, queue: deque[Pending], state: SchedulerState, now: float) -> list[Pending]:
        return list(queue)

    def place(self, program_id: str, state: SchedulerState) -> str | None:
        ready = [e for e in state.engines.values() if e.free > 0]
        if not ready:
            return None
        best = min(ready, key=lambda e: (e.kv_usage, state.programs_on.get(e.name, 0), e.in_flight, e.name))
        return best.name


class Scheduler:
    def __init__(self, clock: Clock, policy: Policy | None = None) -> None:
        self.clock = clock
        self.policy: Policy = policy or FifoSticky()
        self.state = SchedulerState(engines={}, placement={})
        self.queue: deque[Pending] = deque()
        self.running: dict[str, tuple[str, str]] = {}  # request id -> (program id, engine)
        self._moved: dict[str, str] = {}  # program id -> engine it lost

    # engines --------------------------------------------------------------
    def add_engine(self, name: str, capacity: int = 256) -> None:
        if capacity < 1:
            raise InvalidRequest(f"engine {name!r}: capacity must be >= 1")
        self.state.engines[name] = EngineView(name, capacity)

    def update_engine(self, name: str, *, kv_usage: float | None = None, healthy: bool | None = None) -> None:
        e = self.state.engines[name]
        if kv_usage is not None:
            e.kv_usage = kv_usage
        if healthy is False and e.healthy:
            self.engine_down(name)
        elif healthy is not None:
            e.healthy = healthy

    def engine_down(self, name: str) -> list[str]:
        """Mark an engine dead and unpin its programs; returns the programs that will move."""
        self.state.engines[name].healthy = False
        moved = [p for p, e in self.state.placement.items() if e == name]
        for p in moved:
            del self.state.placement[p]
            self._moved[p] = name
        self.state.programs_on[name] = 0
        return moved

    # requests -------------------------------------------------------------
    def submit(self, request_id: str, program_id: str, prompt_tokens: int = 0) -> None:
        if not self.state.engines:
            raise EngineUnavailable("no engine is configured")
        self.queue.append(Pending(request_id, program_id, prompt_tokens, self.clock.now()))

    def cancel(self, request_id: str) -> None:
        """Drop a queued request (client went away) or release a running one."""
        self.queue = deque(p for p in self.queue if p.request_id != request_id)
        self.complete(request_id)

    def dispatch(self) -> list[Dispatch]:
        """Start every queued request that fits, in the policy's order."""
        if not self.queue:
            return []
        now = self.clock.now()
        out: list[Dispatch] = []
        for p in self.policy.order(self.queue, self.state, now):
            engine = self.state.placement.get(p.program_id)
            if engine is None:
                engine = self.policy.place(p.program_id, self.state)
                if engine is None:
                    continue
                self.state.placement[p.program_id] = engine
                self.state.programs_on[engine] = self.state.programs_on.get(engine, 0) + 1
            view = self.state.engines[engine]
            if view.free <= 0:
                continue  # sticky: wait for its own engine
            view.in_flight += 1
            self.running[p.request_id] = (p.program_id, engine)
            moved = self._moved.pop(p.program_id, None)
            out.append(Dispatch(p.request_id, p.program_id, engine, moved, now - p.submitted_at))
        if len(out) == len(self.queue):
            self.queue.clear()
        elif out:
            started = {d.request_id for d in out}
            self.queue = deque(p for p in self.queue if p.request_id not in started)
        return out

    def complete(self, request_id: str) -> None:
        entry = self.running.pop(request_id, None)
        if entry is not None:
            view = self.state.engines.get(entry[1])
            if view is not None:
                view.in_flight -= 1

    def forget(self, program_id: str) -> None:
        """A program ended: free its placement."""
        engine = self.state.placement.pop(program_id, None)
        if engine is not None:
            self.state.programs_on[engine] = max(0, self.state.programs_on.get(engine, 0) - 1)
        self._moved.pop(program_id, None)

    def healthy_engines(self) -> list[str]:
        return [e.name for e in self.state.engines.values() if e.healthy]
