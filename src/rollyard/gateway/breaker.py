"""Two small pure policies that keep one failure from spreading (clocks injected).

``CircuitBreaker`` (per engine): an engine is held out of routing after ``threshold``
consecutive connection failures, or at once when a health probe fails (``trip``), for a backoff
that doubles with each further opening (``base_s`` .. ``max_s``) and resets on the first
success. One request's dropped connection is not an outage: while other requests (or the probe
it triggers) succeed, the count resets and every other program keeps its engine. Only
connection-level failures (refused, reset, timed out, failed health poll) feed it: an engine
that *answers* with an error is alive, and the error belongs to the request.

``ErrorBudget`` (per program): a program whose requests failed ``max_errors`` times within
``window_s`` is refused (429) for ``cooldown_s``; other programs are not affected. State is
freed when the program ends and pruned when idle, so memory stays bounded.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rollyard.core.clock import Clock


@dataclass
class CircuitBreaker:
    clock: Clock
    base_s: float = 1.0
    max_s: float = 30.0
    threshold: int = 3  # consecutive connection failures that open a closed breaker
    failures: int = 0  # consecutive
    open_until: float = 0.0
    opens: int = 0  # times it opened (a metric)
    streak: int = 0  # openings since the last success (sets the backoff)

    def failure(self) -> float:
        """Record a connection failure; returns the backoff now in force (0: still closed).

        Failures while already open are the same incident (many requests in flight when the
        connection broke): they do not lengthen the backoff. A failed probe (the first call
        after a backoff) reopens at once, for twice as long.
        """
        now = self.clock.now()
        if now < self.open_until:
            return self.open_until - now
        self.failures += 1
        if not self.streak and self.failures < self.threshold:
            return 0.0
        return self._open(now)

    def trip(self) -> float:
        """Open now, whatever the count (a health probe failed); returns the backoff in force."""
        now = self.clock.now()
        if now < self.open_until:
            return self.open_until - now
        self.failures += 1
        return self._open(now)

    def _open(self, now: float) -> float:
        self.streak += 1
        backoff = min(self.max_s, self.base_s * 2 ** (self.streak - 1))
        self.open_until = now + backoff
        self.opens += 1
        return backoff

    def success(self) -> None:
        self.failures, self.streak, self.open_until = 0, 0, 0.0

    def wait_s(self) -> float:
        """Seconds until a probe may pass (0: closed, or half-open)."""
        return max(0.0, self.open_until - self.clock.now())

    @property
    def state(self) -> str:
        if not self.streak:
            return "closed"
        return "open" if self.wait_s() > 0 else "half_open"


@dataclass
class ErrorBudget:
    clock: Clock
    max_errors: int = 20  # 0: off
    window_s: float = 60.0
    cooldown_s: float = 30.0
    max_programs: int = 10_000  # tracked at once; idle ones are pruned first
    _errors: dict[str, deque[float]] = field(default_factory=dict)
    _until: dict[str, float] = field(default_factory=dict)
    throttled: int = 0  # times a program was throttled (a metric)

    def charge(self, program_id: str) -> None:
        """Record one failed request of ``program_id``; throttle it when its budget is spent."""
        if not self.max_errors:
            return
        now = self.clock.now()
        q = self._errors.get(program_id)
        if q is None:
            if len(self._errors) >= self.max_programs:
                self._prune(now)
            q = self._errors[program_id] = deque(maxlen=self.max_errors)
        q.append(now)
        if len(q) == self.max_errors and now - q[0] <= self.window_s:
            self._until[program_id] = now + self.cooldown_s
            self.throttled += 1
            q.clear()

    def wait_s(self, program_id: str) -> float:
        """Seconds ``program_id`` must still wait (0: it may send)."""
        until = self._until.get(program_id)
        if until is None:
            return 0.0
        left = until - self.clock.now()
        if left <= 0:
            del self._until[program_id]
            return 0.0
        return left

    def forget(self, program_id: str) -> None:
        self._errors.pop(program_id, None)
        self._until.pop(program_id, None)

    def __len__(self) -> int:
        return len(self._errors)

    def _prune(self, now: float) -> None:
        stale = [p for p, q in self._errors.items() if not q or now - q[-1] > self.window_s]
        for p in stale:
            del self._errors[p]
        while len(self._errors) >= self.max_programs:  # all recent: drop the oldest entry
            del self._errors[next(iter(self._errors))]
