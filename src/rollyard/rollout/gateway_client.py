"""What a run asks of its gateway process, over the gateway's admin API.

Programs (create, report agent-side events, finish, read the trajectory) and engines (the
version fence around a weight update, hold / release / serving after a restart, a stats poll,
the scheduler's counts and loop lag). Errors come back as the typed errors the gateway raised.
``hold``, ``release`` and ``serving`` are synchronous because the fleet and publisher call them
synchronously; each is one loopback call to another process, rare (restarts and failed
updates), and the run's loop is not the gateway's.
"""

from __future__ import annotations

from typing import Any

import httpx

from rollyard.core.errors import GatewayUnavailable
from rollyard.core.events import Event
from rollyard.core.program import Program, ProgramState
from rollyard.core.trajectory import Outcome, Trajectory
from rollyard.gateway.shard_calls import raise_for

TIMEOUT_S = 60.0
FENCE_TIMEOUT_S = 900.0  # entering waits out the engine's longest request in flight
_EVENTS_PER_CALL = 5000
_CREATE_FIELDS = ("id", "group_id", "group_size", "task_id", "sampling", "context_limit", "metadata")


class GatewayClient:
    def __init__(self, url: str, admin_token: str) -> None:
        self.url = url
        headers = {"authorization": f"Bearer {admin_token}"}
        self._http = httpx.AsyncClient(base_url=url, headers=headers, timeout=TIMEOUT_S, trust_env=False)
        self._sync = httpx.Client(base_url=url, headers=headers, timeout=TIMEOUT_S, trust_env=False)

    async def aclose(self) -> None:
        await self._http.aclose()
        self._sync.close()

    async def _call(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        kw: dict[str, Any] = {"json": body}
        if timeout is not None:
            kw["timeout"] = timeout
        try:
            resp = await self._http.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise GatewayUnavailable(f"the run's gateway did not answer {method} {path}: {e!r}") from e
        raise_for(resp, "the run's gateway")
        return resp.json()

    def _call_sync(self, method: str, path: str, body: Any = None) -> Any:
        try:
            resp = self._sync.request(method, path, json=body)
        except httpx.HTTPError as e:
            raise GatewayUnavailable(f"the run's gateway did not answer {method} {path}: {e!r}") from e
        raise_for(resp, "the run's gateway")
        return resp.json()

    # programs -----------------------------------------------------------------------------------
    async def create(self, program: Program) -> Program:
        """Create ``program`` (its id, group, task, sampling...); the gateway's, with its key."""
        body = program.model_dump(mode="json", include=set(_CREATE_FIELDS), exclude_none=True)
        made = await self._call("POST", "/programs", body)
        return Program.model_validate({k: v for k, v in made.items() if k in Program.model_fields})

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
        """Versions, holds, health; the scheduler's counts; loop lag since the previous call."""
        return await self._call("GET", "/engines")  # type: ignore[no-any-return]

    async def refresh(self) -> None:
        await self._call("POST", "/engines/refresh")

    async def enter_fence(self, engine: str) -> float:
        """Drain and pause ``engine`` in the gateway; the seconds the drain took."""
        answer = await self._call("POST", f"/engines/{engine}/fence", {}, timeout=FENCE_TIMEOUT_S)
        return float(answer["drained_s"])

    async def leave_fence(self, engine: str, version: int, failed: str | None) -> None:
        why = failed[:2000] if failed is not None else None
        await self._call("POST", f"/engines/{engine}/fence/leave", {"version": version, "failed": why})

    def hold(self, engine: str, why: str) -> None:
        self._call_sync("POST", f"/engines/{engine}/hold", {"why": why[:2000]})

    def release(self, engine: str) -> None:
        self._call_sync("POST", f"/engines/{engine}/release")

    def serving(self, engine: str, version: int) -> None:
        self._call_sync("POST", f"/engines/{engine}/serving", {"version": version})
