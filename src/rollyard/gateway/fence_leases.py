"""Version fences held for another process: the trainer updates weights, the gateway fences.

The fence (``engines/fence.py``) must run where the requests are counted and stamped: in the
gateway's process. When the trainer lives in another process (``rollyard train`` runs its
gateway as a child), it takes a fence through two admin calls: ``enter`` waits until the
engine is drained and paused and returns the drain time; the trainer then moves the weights
to the engine itself; ``leave`` says how it went (the version now served, or why it failed).
Between them the fence is a *lease*: if ``leave`` does not come within ``lease_s`` (the
trainer died or hung), the engine is held out as after any failed update, never left serving
weights nobody vouched for.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any

from rollyard.core.errors import Conflict, EngineUnavailable, InvalidRequest

log = logging.getLogger(__name__)

DEFAULT_LEASE_S = 900.0  # a 32B model over a slow link, with room to spare


class UpdateFailed(Exception):
    """The trainer said the update failed: raised inside the fence, which holds the engine."""


@dataclass
class _Lease:
    entered: asyncio.Future[float]
    outcome: asyncio.Future[tuple[int, str | None]]
    task: asyncio.Task[None] | None = None


@dataclass
class FenceLeases:
    """One lease per engine at most."""

    lease_s: float = DEFAULT_LEASE_S
    _leases: dict[str, _Lease] = field(default_factory=dict)

    async def enter(self, backend: Any, lease_s: float | None = None) -> float:
        """Fence ``backend`` (drain, pause) for another process; the seconds it took to drain."""
        if getattr(backend, "fenced", None) is None:
            raise InvalidRequest(f"engine {backend.name} has no version fence")
        if backend.name in self._leases:
            raise Conflict(f"engine {backend.name} is fenced already")
        loop = asyncio.get_running_loop()
        lease = _Lease(loop.create_future(), loop.create_future())
        self._leases[backend.name] = lease
        lease.task = asyncio.create_task(self._hold(backend, lease, lease_s or self.lease_s))
        try:
            return await asyncio.shield(lease.entered)
        except BaseException:
            if not lease.outcome.done():  # the caller gave up while draining: end the fence
                lease.outcome.set_result((backend.policy_version, "the fence's caller went away"))
            raise

    async def leave(self, name: str, version: int, failed: str | None) -> None:
        """End the lease: ``version`` is what the engine now serves (``failed``: why not; the
        engine is then held out). Returns when the engine serves again (or is held)."""
        lease = self._leases.get(name)
        if lease is None or lease.task is None:
            raise Conflict(f"engine {name} is not fenced")
        if not lease.outcome.done():
            lease.outcome.set_result((version, failed))
        await asyncio.shield(lease.task)

    async def _hold(self, backend: Any, lease: _Lease, lease_s: float) -> None:
        try:
            async with backend.fenced() as drained:
                lease.entered.set_result(drained)
                try:
                    version, failed = await asyncio.wait_for(asyncio.shield(lease.outcome), lease_s)
                except TimeoutError:
                    raise UpdateFailed(f"the weight update's lease ran out after {lease_s:.0f} s") from None
                if failed is not None:
                    raise UpdateFailed(failed)
                backend.commit(version)
        except UpdateFailed as e:  # the fence held the engine out and resumed it
            log.warning("engine=%s: %s", backend.name, e)
        except Exception as e:  # the fence could not begin (pause failed): say so to enter()
            if not lease.entered.done():
                lease.entered.set_exception(EngineUnavailable(f"engine {backend.name}: fence failed: {e}"))
            else:
                log.error("engine=%s: fence ended with %s: %s", backend.name, type(e).__name__, e)
        finally:
            self._leases.pop(backend.name, None)
            with contextlib.suppress(asyncio.InvalidStateError):
                lease.entered.set_exception(EngineUnavailable(f"engine {backend.name}: fence ended"))

    async def aclose(self) -> None:
        """End every lease as failed (the gateway is stopping)."""
        for name, lease in list(self._leases.items()):
            if not lease.outcome.done():
                lease.outcome.set_result((0, "the gateway is stopping"))
            if lease.task is not None:
                with contextlib.suppress(Exception):
                    await lease.task
            self._leases.pop(name, None)
