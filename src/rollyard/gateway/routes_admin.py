"""Program administration: create, list, read, finish, trajectory; all need the admin token.

A program's own key reaches only the model endpoints, never these (not even for itself).

None of it is served on the unix socket that sandboxes reach (403 there, even with the admin token).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import NotFound
from rollyard.core.program import Program, ProgramState, SamplingPolicy
from rollyard.core.trajectory import Event, Outcome
from rollyard.gateway.edge import PROGRAM_ID, api_key, gateway, not_on_sandbox_socket
from rollyard.gateway.limits import StrictRoute
from rollyard.gateway.shard_calls import ShardPeers, call, on_holder, others_lists, passed_on

router = APIRouter(dependencies=[Depends(not_on_sandbox_socket)], route_class=StrictRoute)


class CreateProgram(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str | None = Field(default=None, pattern=PROGRAM_ID, max_length=64)
    group_id: str = "default"
    group_size: int = Field(default=1, ge=1, le=4096)  # how many programs share group_id
    task_id: str = "default"
    sampling: SamplingPolicy = Field(default_factory=SamplingPolicy)
    context_limit: int | None = Field(default=None, ge=1)
    metadata: dict[str, str] = Field(default_factory=dict)


class ProgramEvents(BaseModel):
    model_config = ConfigDict(extra="forbid")

    events: list[Event] = Field(max_length=10_000)


class FinishProgram(BaseModel):
    model_config = ConfigDict(extra="forbid")

    state: ProgramState = ProgramState.FINISHED
    status: str | None = None
    outcome: Outcome | None = None


@router.post("/programs", status_code=201)
async def create_program(body: CreateProgram, request: Request) -> dict[str, Any]:
    """Create a program; the answer is the only place its API key is ever shown. ``base_urls``
    are what each API's client takes as its base URL (OpenAI SDKs and litellm: ``.../v1``;
    Anthropic SDKs and Claude Code: the origin, they add ``/v1`` themselves), as reached by
    this request: a client elsewhere uses its own address of the gateway. With shards, the
    program is created on the shard that owns it (``gateway/shards.py``); ``base_urls`` and
    ``shard`` say where it lives."""
    gw = gateway(request)
    token = api_key(request)
    gw.programs.require_admin(token)
    peers: ShardPeers = request.app.state.peers
    layout = peers.layout
    fields = body.model_dump(exclude_none=True)
    program = Program(**fields)
    owner = layout.owner(program.id, program.group_id, program.group_size)
    if owner != layout.index and passed_on(layout, request.headers):
        made = await call(peers, owner, "POST", "/programs", token or "", {**fields, "id": program.id})
        made.pop("base_urls", None)  # the owner's view of its address; the caller's is rebuilt
        origin = str(request.base_url.replace(port=layout.port_of(owner))).rstrip("/")
    else:
        owner = layout.index
        made = {**gw.programs.create(program).public(), "api_key": program.api_key}
        origin = str(request.base_url).rstrip("/")
    urls = {"openai": f"{origin}/v1", "anthropic": origin}
    return {**made, "shard": owner, "base_urls": urls}


@router.get("/programs")
async def list_programs(request: Request, group_id: str | None = None) -> dict[str, Any]:
    """Every program (of every shard), oldest first."""
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    progs = [p.public() for p in gw.programs.all() if group_id is None or p.group_id == group_id]
    peers: ShardPeers = request.app.state.peers
    if passed_on(peers.layout, request.headers):
        params = {"group_id": group_id} if group_id is not None else {}
        progs += await others_lists(peers, api_key(request) or "", params)
        progs.sort(key=lambda p: (p["created_at"], p["id"]))
    return {"object": "list", "data": progs}


async def _elsewhere(request: Request, program_id: str, body: Any = None) -> Any | None:
    """Admin only. None when this shard holds the program; else the answer of the shard that does,
    asked the same call (``body``); NotFound when none does or the gateway is not sharded."""
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    try:
        gw.programs.get(program_id)
        return None
    except NotFound:
        peers: ShardPeers = request.app.state.peers
        if not passed_on(peers.layout, request.headers):
            raise
    return await on_holder(peers, request.method, request.url.path, api_key(request) or "", body)


@router.get("/programs/{program_id}")
async def get_program(program_id: str, request: Request) -> dict[str, Any]:
    if (answer := await _elsewhere(request, program_id)) is not None:
        return answer
    return gateway(request).programs.get(program_id).public()


@router.post("/programs/{program_id}/finish")
async def finish_program(program_id: str, body: FinishProgram, request: Request) -> dict[str, Any]:
    """End a program (finished or terminated) and fire the termination hooks; answered once its
    turn in flight, if any, is journaled (``Gateway.finish``)."""
    if (answer := await _elsewhere(request, program_id, body.model_dump(mode="json"))) is not None:
        return answer
    return (await gateway(request).finish(program_id, body.state, body.status, body.outcome)).public()


@router.get("/programs/{program_id}/trajectory")
async def trajectory(program_id: str, request: Request) -> dict[str, Any]:
    if (answer := await _elsewhere(request, program_id)) is not None:
        return answer
    traj = await gateway(request).journal.atrajectory(program_id)  # read, rebuilt and dumped off the loop
    return await asyncio.to_thread(traj.model_dump, mode="json")


@router.post("/programs/{program_id}/events")
async def record_events(program_id: str, body: ProgramEvents, request: Request) -> dict[str, Any]:
    """Append what happened on the agent's side (tool results, context management) to a
    program's journal: the runner of ``rollyard train`` reports its sandbox's events here."""
    if (answer := await _elsewhere(request, program_id, body.model_dump(mode="json"))) is not None:
        return answer
    gateway(request).journal.record_events(program_id, body.events)
    return {"id": program_id, "recorded": len(body.events)}
