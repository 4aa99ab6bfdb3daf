"""Program administration: create, list, read, finish, trajectory; all need the admin token.

A program's own key reaches only the model endpoints, never these (not even for itself).

None of it is served on the unix socket that sandboxes reach (403 there, even with the admin token).
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.program import Program, ProgramState, SamplingPolicy
from rollyard.core.trajectory import Outcome
from rollyard.gateway.edge import PROGRAM_ID, api_key, gateway, not_on_sandbox_socket
from rollyard.gateway.limits import StrictRoute

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
    this request: a client elsewhere uses its own address of the gateway."""
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    fields = body.model_dump(exclude_none=True)
    program = gw.programs.create(Program(**fields))
    origin = str(request.base_url).rstrip("/")
    urls = {"openai": f"{origin}/v1", "anthropic": origin}
    return {**program.public(), "api_key": program.api_key, "base_urls": urls}


@router.get("/programs")
async def list_programs(request: Request, group_id: str | None = None) -> dict[str, Any]:
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    progs = [p.public() for p in gw.programs.all() if group_id is None or p.group_id == group_id]
    return {"object": "list", "data": progs}


@router.get("/programs/{program_id}")
async def get_program(program_id: str, request: Request) -> dict[str, Any]:
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    return gw.programs.get(program_id).public()


@router.post("/programs/{program_id}/finish")
async def finish_program(program_id: str, body: FinishProgram, request: Request) -> dict[str, Any]:
    """End a program (finished or terminated) and fire the termination hooks; answered once its
    turn in flight, if any, is journaled (``Gateway.finish``)."""
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    return (await gw.finish(program_id, body.state, body.status, body.outcome)).public()


@router.get("/programs/{program_id}/trajectory")
async def trajectory(program_id: str, request: Request) -> dict[str, Any]:
    gw = gateway(request)
    gw.programs.require_admin(api_key(request))
    gw.programs.get(program_id)
    traj = await gw.journal.atrajectory(program_id)  # read, rebuilt and dumped off the loop
    return await asyncio.to_thread(traj.model_dump, mode="json")
