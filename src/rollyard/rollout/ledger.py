"""Which groups exist and what became of each: the bookkeeping behind "no lost or duplicated group".

Groups are numbered 0, 1, 2, ...; number n always means the same group id and the same task
(``task_for``), so a group that was in flight when a run was killed is simply issued again on
resume, under its own id. Every number ends exactly once, as trained (at a step) or dropped
(with a reason); the ledger is saved in the trainer checkpoint's extra state, so it and the
weights always agree.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, TypeVar

from rollyard.core.errors import Conflict, DataError

T = TypeVar("T")


def group_id(number: int) -> str:
    return f"g{number:06d}"


def task_for(number: int, tasks: Sequence[T], seed: int) -> T:
    """Epoch-shuffled, deterministic: each task once per pass over the set."""
    if not tasks:
        raise DataError("no tasks to choose from")
    epoch, pos = divmod(number, len(tasks))
    order = list(range(len(tasks)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return tasks[order[pos]]


class GroupLedger:
    def __init__(self) -> None:
        self.trained: dict[int, int] = {}  # number -> step
        self.dropped: dict[int, str] = {}  # number -> reason
        self._issued: set[int] = set()  # in flight (never saved: in-flight groups are re-issued)

    def _done(self, n: int) -> bool:
        return n in self.trained or n in self.dropped

    def claim(self) -> int:
        """The smallest group number neither finished nor in flight."""
        n = 0
        while self._done(n) or n in self._issued:
            n += 1
        self._issued.add(n)
        return n

    def in_flight(self) -> int:
        return len(self._issued)

    def mark_trained(self, n: int, step: int) -> None:
        self._finish(n)
        self.trained[n] = step

    def mark_dropped(self, n: int, reason: str) -> None:
        self._finish(n)
        self.dropped[n] = reason

    def _finish(self, n: int) -> None:
        if self._done(n):
            raise Conflict(f"group {group_id(n)} already ended")
        self._issued.discard(n)

    def state_dict(self) -> dict[str, Any]:
        return {"trained": {str(k): v for k, v in self.trained.items()}, "dropped": dict(self.dropped)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GroupLedger:
        led = cls()
        try:
            led.trained = {int(k): int(v) for k, v in state.get("trained", {}).items()}
            led.dropped = {int(k): str(v) for k, v in state.get("dropped", {}).items()}
        except (TypeError, ValueError) as e:
            raise DataError(f"malformed group ledger: {e}") from e
        if set(led.trained) & set(led.dropped):
            raise DataError("malformed group ledger: a group is both trained and dropped")
        return led
