"""Programs that never finish: ended after an idle TTL so their per-program state is freed.

A client that crashes, or a rollout that forgets ``POST /programs/{id}/finish``, would keep the
program's conversation, scheduler entry and error-budget row in the gateway forever (the RSS
grows with every program ever served). ``IdlePrograms`` (pure, clock injected) remembers when
each live program last made a model request; ``reap_idle`` terminates those idle longer than
``ttl_s`` (status ``idle_timeout``) through the program table, so every termination hook frees
what it holds, exactly as a normal finish does. The journal keeps their turns. A program with
a request in flight is never idle.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from rollyard.core.clock import Clock
from rollyard.core.errors import Conflict, NotFound
from rollyard.core.program import ProgramState
from rollyard.gateway.programs import ProgramTable

log = logging.getLogger(__name__)

IDLE_STATUS = "idle_timeout"


class IdlePrograms:
    """Last activity per live program, oldest first (a dict keeps insertion order)."""

    def __init__(self, clock: Clock, ttl_s: float) -> None:
        self.clock, self.ttl_s = clock, ttl_s
        self._seen: dict[str, float] = {}

    def touch(self, program_id: str) -> None:
        self._seen.pop(program_id, None)
        self._seen[program_id] = self.clock.now()

    def forget(self, program_id: str) -> None:
        self._seen.pop(program_id, None)

    def __len__(self) -> int:
        return len(self._seen)

    def expired(self) -> list[str]:
        """Programs idle for longer than the TTL (none when the TTL is 0: off)."""
        if not self.ttl_s:
            return []
        cutoff = self.clock.now() - self.ttl_s
        out = []
        for pid, at in self._seen.items():
            if at > cutoff:
                break  # the rest were seen later
            out.append(pid)
        return out


def reap_idle(idle: IdlePrograms, programs: ProgramTable, busy: Callable[[str], bool]) -> list[str]:
    """Terminate the expired programs that have no request in flight; returns their ids."""
    ended = []
    for pid in idle.expired():
        if busy(pid):
            idle.touch(pid)
            continue
        try:
            programs.finish(pid, ProgramState.TERMINATED, IDLE_STATUS)
        except (Conflict, NotFound):  # ended meanwhile
            idle.forget(pid)
            continue
        log.info("program ended after idling id=%s ttl_s=%.0f", pid, idle.ttl_s)
        ended.append(pid)
    return ended


async def reap_forever(
    idle: IdlePrograms, programs: ProgramTable, busy: Callable[[str], bool], on_reap: Callable[[int], None]
) -> None:
    """Check a few times per TTL (at least every 30 s); nothing to do when the TTL is 0."""
    if not idle.ttl_s:
        return
    interval = max(0.05, min(idle.ttl_s / 4, 30.0))
    while True:
        await asyncio.sleep(interval)
        if ended := reap_idle(idle, programs, busy):
            on_reap(len(ended))
