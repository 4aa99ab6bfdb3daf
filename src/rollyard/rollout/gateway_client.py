"""What a run asks of its gateway process, over the gateway's admin API.

Programs (create, report agent-side events, finish, read the trajectory) and engines (the
version fence around a weight update, hold / release / serving after a restart, a stats poll,
the scheduler's counts and loop lag). Errors come back as the typed errors the gateway raised.
``hold``, ``release`` and ``serving`` are synchronous because the fleet and publisher call them
synchronously; each is one loopback call to another process, rare (restarts and failed
updates), and the run's loop is not the gateway's.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx

from rollyard.core.events import Event
from rollyard.core.program import Program, ProgramState
from rollyard.core.trajectory import Outcome, Trajectory
from rollyard.gateway.shard_calls import raise_for, unanswered_as_unavailable

TIMEOUT_S = 60.0
FENCE_TIMEOUT_S = 900.0  # entering waits out the engine's longest request in flight
_EVENTS_PER_CALL = 5000
_CREATE_FIELDS = ("id", "group_id", "group_size", "task_id", "sampling", "context_limit", "metadata")


class GatewayClient:
    """``urls``: each gateway shard's (one for an unsharded gateway). Programs are asked of the
    first (any shard's admin API reaches every program); engine calls go to every shard, each
    of which fences and stamps its own requests."""

    def __init__(self, urls: list[str], admin_token: str) -> None:
        self.urls = urls
        headers = {"authorization": f"Bearer {admin_token}"}
        self._http = httpx.AsyncClient(headers=headers, timeout=TIMEOUT_S, trust_env=False)
        self._sync = httpx.Client(headers=headers, timeout=TIMEOUT_S, trust_env=False)

    async def aclose(self) -> None:
        await self._http.aclose()
        self._sync.close()

    async def _call(
        self, method: str, path: str, body: Any = None, timeout: float | None = None, shard: int = 0
    ) -> Any:
        kw: dict[str, Any] = {"json": body}
        if timeout is not None:
            kw["timeout"] = timeout
        with unanswered_as_unavailable(f"the run's gateway ({method} {path})"):
            resp = await self._http.request(method, self.urls[shard] + path, **kw)
        raise_for(resp, "the run's gateway")
        return resp.json()

    async def _each(
        self, method: str, path: str, body: Any = None, timeout: float | None = None
    ) -> list[Any]:
        """The same call on every shard, at once."""
        calls = (self._call(method, path, body, timeout, k) for k in range(len(self.urls)))
        return list(await asyncio.gather(*calls))

    def _each_sync(self, method: str, path: str, body: Any = None) -> None:
        for url in self.urls:
            with unanswered_as_unavailable(f"the run's gateway ({method} {path})"):
                resp = self._sync.request(method, url + path, json=body)
            raise_for(resp, "the run's gateway")

    # programs -----------------------------------------------------------------------------------
    async def create(self, program: Program) -> tuple[Program, int]:
        """Create ``program`` (its id, group, task, sampling...): the gateway's, with its key, and
        the shard it lives on (whose address its agent must be given)."""
        body = program.model_dump(mode="json", include=set(_CREATE_FIELDS), exclude_none=True)
        made = await self._call("POST", "/programs", body)
        created = Program.model_validate({k: v for k, v in made.items() if k in Program.model_fields})
        return created, int(made.get("shard", 0))

    async def record_events(self, program_id: str, events: list[Event]) -> None:
        for i in range(0, len(events), _EVENTS_PER_CALL):
            body = {"events": [e.model_dump(mode="json") for e in events[i : i + _EVENTS_PER_CALL]]}
            await self._call("POST", f"/programs/{program_id}/events", body)

    async def finish(
        self, program_id: str, state: ProgramState, status: str | None, outcome: Outcome | None = None
    ) -> None:
        """End the program; returns once its turn in flight, if any, is journaled."""
        body = {
            "state": state.value,
            "status": status,
            "outcome": outcome.model_dump(mode="json") if outcome else None,
        }
        await self._call("POST", f"/programs/{program_id}/finish", body)

    async def trajectory(self, program_id: str) -> Trajectory:
        return Trajectory.model_validate(await self._call("GET", f"/programs/{program_id}/trajectory"))

    # engines --------------------------------------------------------------------------------------
    async def engines(self) -> dict[str, Any]:
        """Versions, holds, health (the first shard's view); the scheduler's counts summed over
        shards; the worst shard's loop lag since the previous call."""
        shards = await self._each("GET", "/engines")
        counts: dict[str, int] = {}
        for s in shards:
            for k, v in s["counts"].items():
                counts[k] = counts.get(k, 0) + v
        return {
            "data": shards[0]["data"],
            "counts": counts,
            "loop_lag_p99_ms": max(s["loop_lag_p99_ms"] for s in shards),
            "loop_lag_max_ms": max(s["loop_lag_max_ms"] for s in shards),
        }

    async def refresh(self) -> None:
        await self._each("POST", "/engines/refresh")

    async def enter_fence(self, engine: str) -> float:
        """Drain and pause ``engine`` in every shard (the engine is paused once all have drained:
        each shard's ``/pause?mode=wait`` waits out the others' requests too); the longest drain."""
        path = f"/engines/{engine}/fence"
        calls = (self._call("POST", path, {}, FENCE_TIMEOUT_S, k) for k in range(len(self.urls)))
        answers = await asyncio.gather(*calls, return_exceptions=True)
        failed = [a for a in answers if isinstance(a, BaseException)]
        if failed:  # the shards that did fence must not wait out their lease: failed, held out
            why = f"the fence failed on another gateway shard: {failed[0]}"[:2000]
            for k, a in enumerate(answers):
                if not isinstance(a, BaseException):
                    with contextlib.suppress(Exception):
                        await self._call("POST", f"{path}/leave", {"version": 0, "failed": why}, shard=k)
            raise failed[0]
        return max(float(a["drained_s"]) for a in answers)  # type: ignore[index]

    async def leave_fence(self, engine: str, version: int, failed: str | None) -> None:
        why = failed[:2000] if failed is not None else None
        await self._each("POST", f"/engines/{engine}/fence/leave", {"version": version, "failed": why})

    def hold(self, engine: str, why: str) -> None:
        self._each_sync("POST", f"/engines/{engine}/hold", {"why": why[:2000]})

    def release(self, engine: str) -> None:
        self._each_sync("POST", f"/engines/{engine}/release")

    def serving(self, engine: str, version: int) -> None:
        self._each_sync("POST", f"/engines/{engine}/serving", {"version": version})
