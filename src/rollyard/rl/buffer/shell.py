"""The asyncio shell around ``WindowedFifo`` (what the training loop uses).

The core decides; a shell only serialises calls and lets a trainer wait for a batch.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from rollyard.core.clock import Clock
from rollyard.rl.buffer.config import BufferConfig
from rollyard.rl.buffer.core import Release, Released, WindowedFifo


class AsyncBuffer:
    """An asyncio face: producers submit and complete, the trainer awaits ``get``.

    All methods must run on one event loop; ``get`` wakes whenever an item finishes.
    """

    def __init__(self, config: BufferConfig, clock: Clock | None = None) -> None:
        self.core = WindowedFifo(config, clock)
        self._cond = asyncio.Condition()
        self._closed = False

    async def submit(self, item_id: str, **fields: Any) -> int:
        async with self._cond:
            return self.core.submit(item_id, **fields)

    async def complete(self, item_id: str, **fields: Any) -> None:
        async with self._cond:
            self.core.complete(item_id, **fields)
            self._cond.notify_all()

    async def discard(self, item_id: str) -> None:
        async with self._cond:
            self.core.discard(item_id)
            self._cond.notify_all()

    async def close(self) -> None:
        """Wake every waiting ``get``; later gets return what is ready without waiting."""
        async with self._cond:
            self._closed = True
            self._cond.notify_all()

    async def get(self, trainer_version: int, units: int, timeout: float | None = None) -> Release:
        """Wait until ``units`` units are released (fewer on timeout or close, or as soon as a unit
        is dropped: the caller must hear of a drop to produce its replacement, or it would wait
        forever for units that nobody is making)."""
        items: list[Released] = []
        dropped: list[Released] = []
        taken = 0

        async def fill() -> None:
            nonlocal taken
            async with self._cond:
                while True:
                    got = self.core.release(trainer_version, units - taken)
                    items.extend(got.items)
                    dropped.extend(got.dropped)
                    taken += _units_in(got.items, self.core.config.group_whole)
                    if taken >= units or self._closed or dropped:
                        return
                    await self._cond.wait()

        with contextlib.suppress(TimeoutError):  # a timeout returns what was gathered
            await asyncio.wait_for(fill(), timeout)
        return Release(items=items, dropped=dropped)

    def state_dict(self) -> dict[str, Any]:
        return self.core.state_dict()


def _units_in(items: list[Released], group_whole: bool) -> int:
    return len({r.group_id for r in items}) if group_whole else len(items)
