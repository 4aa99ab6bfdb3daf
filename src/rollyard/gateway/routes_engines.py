"""Engine administration (admin token, never on the sandboxes' socket): what the trainer of a
``rollyard train`` run needs from its gateway process to update weights behind the version fence
(``fence_leases.py``), hold out and bring back engines it restarts, and read the scheduler's
counts and the event loop's lag for its step rows."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import NotFound
from rollyard.gateway.edge import api_key, gateway, not_on_sandbox_socket
from rollyard.gateway.fence_leases import FenceLeases
from rollyard.gateway.limits import StrictRoute

router = APIRouter(dependencies=[Depends(not_on_sandbox_socket)], route_class=StrictRoute)


class Hold(BaseModel):
    model_config = ConfigDict(extra="forbid")

    why: str = Field(min_length=1, max_length=2000)


class Serving(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0)


class Enter(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lease_s: float | None = Field(default=None, gt=0, le=86_400)


class Leave(BaseModel):
    model_config = ConfigDict(extra="forbid")

    version: int = Field(ge=0)
    failed: str | None = Field(default=None, max_length=2000)


def _backend(request: Request, name: str) -> Any:
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    backend = gw.pool.backends.get(name)
    if backend is None:
        raise NotFound(f"no engine {name!r}; engines: {', '.join(gw.pool.backends)}")
    return backend


def _leases(request: Request) -> FenceLeases:
    return request.app.state.fence_leases  # type: ignore[no-any-return]


@router.get("/engines")
async def engines(request: Request) -> dict[str, Any]:
    """Each engine's served version, hold and health; the scheduler's counts; the loop's lag
    since the previous call (``loop_lag_p99_ms``, ``loop_lag_max_ms``)."""
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    healthy = set(gw.pool.scheduler.up_engines())
    rows = [
        {
            "name": name,
            "version": b.policy_version,
            "held": getattr(b, "held", None),
            "healthy": name in healthy,
        }
        for name, b in gw.pool.backends.items()
    ]
    p99, worst = gw.metrics.lag_since_last_read()
    return {
        "object": "list",
        "data": rows,
        "counts": dict(gw.pool.counts),
        "loop_lag_p99_ms": p99 * 1000,
        "loop_lag_max_ms": worst * 1000,
    }


@router.post("/engines/refresh")
async def refresh(request: Request) -> dict[str, Any]:
    """Poll every engine now (after the trainer restarted one)."""
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    await gw.pool.refresh()
    return {"healthy": gw.pool.scheduler.up_engines()}


@router.post("/engines/{name}/hold")
async def hold(name: str, body: Hold, request: Request) -> dict[str, Any]:
    """Refuse the engine's requests (and its health poll) until released."""
    _backend(request, name).hold(body.why)
    return {"name": name, "held": body.why}


@router.post("/engines/{name}/release")
async def release(name: str, request: Request) -> dict[str, Any]:
    _backend(request, name).release()
    return {"name": name, "held": None}


@router.post("/engines/{name}/serving")
async def serving(name: str, body: Serving, request: Request) -> dict[str, Any]:
    """The engine (restarted by the trainer) serves ``version``: stamp its turns so."""
    _backend(request, name).serving(body.version)
    return {"name": name, "version": body.version}


@router.post("/engines/{name}/fence")
async def enter_fence(name: str, body: Enter, request: Request) -> dict[str, Any]:
    """Drain and pause the engine for a weight update; answered once it is (``drained_s``)."""
    drained = await _leases(request).enter(_backend(request, name), body.lease_s)
    return {"name": name, "drained_s": drained}


@router.post("/engines/{name}/fence/leave")
async def leave_fence(name: str, body: Leave, request: Request) -> dict[str, Any]:
    """End the update: the engine serves ``version`` (or, ``failed``, is held out); answered once
    it serves again."""
    backend = _backend(request, name)
    await _leases(request).leave(name, body.version, body.failed)
    return {"name": name, "version": backend.policy_version, "held": getattr(backend, "held", None)}
