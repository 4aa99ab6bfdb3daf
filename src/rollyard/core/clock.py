"""Injected clocks, so policies and buffers run the same under real and simulated time."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float:
        """Seconds, monotonic within one process."""
        ...


class SystemClock:
    """Wall-clock-free monotonic time for live components."""

    def now(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock that moves only when told; for tests and the simulator."""

    def __init__(self, start: float = 0.0) -> None:
        self._t = float(start)

    def now(self) -> float:
        return self._t

    def advance(self, dt: float) -> float:
        if dt < 0:
            raise ValueError("a clock cannot go backwards")
        self._t += dt
        return self._t
