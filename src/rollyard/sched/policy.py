"""A policy is three small parts that compose: a router, an admission (pause) policy, an order.

- ``Router``: which engine a program runs on (first placement, after engine death, and
  whether to move a sticky program away from a saturated engine).
- ``Admission``: who may run now; called every ``tick_s`` and returns pauses and restores.
  Its ``restore`` half also runs when KV is released (a program ends, or a paused program's
  running request does) for policies with ``on_release``, so freed room is handed out at once
  instead of idling until the next tick.
- ``Order``: in what sequence queued requests are tried.

Each part reads the ``SchedState`` and returns values; none mutates anything, so the same
objects run in the gateway, in unit tests and in the simulator under a fake clock.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from rollyard.sched.decisions import Move, Pause, Restore
from rollyard.sched.views import ProgramView, Request, SchedState

__all__ = ["Admission", "Order", "Policy", "Router"]


class Router(Protocol):
    def place(self, program: ProgramView, state: SchedState, now: float) -> str | None:
        """The engine for a program with no healthy placement; None when none has room."""
        ...

    def reroute(self, program: ProgramView, request: Request, state: SchedState, now: float) -> Move | None:
        """Move a placed program before ``request`` starts (e.g. its engine is saturated); None: stay."""
        ...


class Admission(Protocol):
    def tick(self, state: SchedState, now: float) -> list[Pause | Restore]:
        """Periodic decision: which active programs to pause, which paused ones to restore."""
        ...

    def restore(self, state: SchedState, now: float) -> list[Pause | Restore]:
        """The restore half of a tick: who may run in the room there is now (no pressure pauses;
        a policy may pause idle programs to make room for an overdue one)."""
        ...


class Order(Protocol):
    def order(self, queue: Sequence[Request], state: SchedState, now: float) -> list[Request]:
        """The queued requests in the order they should be tried."""
        ...

    def priority(self, request: Request, state: SchedState, now: float) -> int | None:
        """vLLM per-request priority for a started request (lower first); None: engine default."""
        ...


@dataclass(frozen=True)
class Policy:
    """A named composition; ``tick_s`` is how often the shell calls ``Scheduler.tick`` (None: never);
    ``on_release``: the shell also calls ``Scheduler.admit`` when KV is released."""

    name: str
    router: Router
    admission: Admission
    order: Order
    tick_s: float | None = None
    on_release: bool = False
