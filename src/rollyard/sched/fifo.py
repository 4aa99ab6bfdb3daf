"""The baseline parts: FIFO order, admit everyone, sticky least-loaded routing."""

from __future__ import annotations

from collections.abc import Sequence

from rollyard.sched.decisions import Move, Pause, Restore
from rollyard.sched.views import ProgramView, Request, SchedState

__all__ = ["AdmitAll", "FifoOrder", "LeastLoaded"]


class FifoOrder:
    """First come, first served."""

    def order(self, queue: Sequence[Request], state: SchedState, now: float) -> list[Request]:
        return list(queue)

    def priority(self, request: Request, state: SchedState, now: float) -> int | None:
        return None


class AdmitAll:
    """Never pauses anyone."""

    def tick(self, state: SchedState, now: float) -> list[Pause | Restore]:
        return []

    def restore(self, state: SchedState, now: float) -> list[Pause | Restore]:
        return []


class LeastLoaded:
    """Sticky engines; a new or orphaned program goes to the healthy engine with room and the
    lowest KV usage (then fewest programs, fewest in flight); placed programs never move."""

    def place(self, program: ProgramView, state: SchedState, now: float) -> str | None:
        ready = [e for e in state.engines.values() if e.free > 0]
        if not ready:
            return None
        counts: dict[str, int] = {}
        for p in state.programs.values():
            if p.engine is not None and not p.state.is_over:
                counts[p.engine] = counts.get(p.engine, 0) + 1
        best = min(ready, key=lambda e: (e.kv_usage, counts.get(e.name, 0), e.in_flight, e.name))
        return best.name

    def reroute(self, program: ProgramView, request: Request, state: SchedState, now: float) -> Move | None:
        return None
