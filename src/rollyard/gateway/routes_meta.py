"""Health, Prometheus metrics, the model list, and raw ``/v1/completions`` (token ids or text)."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from pydantic import Field

from rollyard.core.errors import InvalidRequest
from rollyard.core.program import Program
from rollyard.gateway.bodies.common import Body, MaxTokens, Seed, Temperature, TopP
from rollyard.gateway.edge import api_key, caller, gateway, not_on_sandbox_socket
from rollyard.gateway.limits import StrictRoute
from rollyard.gateway.model_route import ModelRoute

router = APIRouter(route_class=StrictRoute)  # mounted at the root only
model_router = APIRouter(route_class=ModelRoute)  # mounted under every API prefix


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
    """Prometheus text; needs the admin token unless the gateway runs with ``--open-metrics``."""
    gw = gateway(request)
    if not request.app.state.limits.open_metrics:
        gw.programs.require_admin(api_key(request))
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


TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class CompletionBody(Body):
    model: str = ""
    prompt: str | list[TokenId]
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    seed: Seed | None = None


@model_router.post("/completions")
async def completions(
    body: CompletionBody, request: Request, program: Program = Depends(caller)
) -> dict[str, Any]:
    """A raw completion: no chat template; recorded as a turn like any other model call."""
    gw = gateway(request)
    vocab = getattr(gw.renderer.tok, "vocab_size", 0)
    if isinstance(body.prompt, list) and vocab and any(t >= vocab for t in body.prompt):
        raise InvalidRequest(f"prompt token ids must be below the vocabulary size {vocab}")
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
