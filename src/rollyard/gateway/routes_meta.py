"""Health, Prometheus metrics, the model list, and raw ``/v1/completions`` (token ids or text)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import InvalidRequest
from rollyard.core.program import Program
from rollyard.gateway.edge import caller, gateway, not_on_sandbox_socket

router = APIRouter()  # mounted at the root only
model_router = APIRouter()  # mounted under every API prefix


@router.get("/health")
async def health(request: Request) -> dict[str, Any]:
    gw = gateway(request)
    engines = gw.pool.scheduler.healthy_engines()
    return {
        "status": "ok" if engines else "degraded",
        "engines_healthy": engines,
        "programs": len(gw.programs),
    }


@router.get("/metrics", dependencies=[Depends(not_on_sandbox_socket)])
async def metrics(request: Request) -> Response:
    gw = gateway(request)
    counts = Counter(p.state.value for p in gw.programs.all())
    for state in ("active", "paused", "finished", "terminated"):
        gw.metrics.programs.labels(state).set(counts.get(state, 0))
    gw.pool.observe_metrics()
    return Response(gw.metrics.render(), media_type="text/plain; version=0.0.4")


@model_router.get("/models")
async def models(request: Request) -> dict[str, Any]:
    gw = gateway(request)
    card = {"id": gw.model_name, "object": "model", "created": 0, "owned_by": "rollyard"}
    return {"object": "list", "data": [card]}


class CompletionBody(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = ""
    prompt: str | list[int]
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: int | None = None


@model_router.post("/completions")
async def completions(
    body: CompletionBody, request: Request, program: Program = Depends(caller)
) -> dict[str, Any]:
    """A raw completion: no chat template; recorded as a turn like any other model call."""
    gw = gateway(request)
    if isinstance(body.prompt, list) and any(t < 0 for t in body.prompt):
        raise InvalidRequest("prompt token ids must be >= 0", code="invalid_request_error")
    r = await gw.complete_raw(
        program, body.prompt, body.max_tokens, body.temperature, body.top_p, body.seed, body.model
    )
    return {
        "id": f"cmpl-{r['id']}",
        "object": "text_completion",
        "created": r["created"],
        "model": r["model"],
        "choices": [
            {
                "index": 0,
                "text": r["text"],
                "token_ids": r["token_ids"],
                "finish_reason": r["finish_reason"],
                "logprobs": None,
            }
        ],
        "usage": {
            "prompt_tokens": r["prompt_tokens"],
            "completion_tokens": len(r["token_ids"]),
            "total_tokens": r["prompt_tokens"] + len(r["token_ids"]),
        },
    }
