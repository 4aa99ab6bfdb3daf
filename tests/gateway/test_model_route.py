"""The model endpoints' lean route: what it refuses to wrap, and that every model endpoint uses it."""

from __future__ import annotations

import pytest
from fastapi import APIRouter, Depends, Request
from fastapi.testclient import TestClient

from rollyard.core.program import Program
from rollyard.gateway.bodies import ChatCompletionBody
from rollyard.gateway.edge import caller, not_on_sandbox_socket
from rollyard.gateway.model_route import ModelRoute


def test_a_model_endpoint_with_another_dependency_is_refused_at_definition() -> None:
    router = APIRouter(route_class=ModelRoute)
    with pytest.raises(TypeError, match="depends on `caller` only"):

        @router.post("/x", dependencies=[Depends(not_on_sandbox_socket)])
        async def x(body: ChatCompletionBody, request: Request, program: Program = Depends(caller)) -> dict:
            return {}


def test_every_model_endpoint_with_a_body_takes_the_lean_route(client: TestClient) -> None:
    posts = [r for r in client.app.routes if getattr(r, "methods", None) == {"POST"}]
    model = [r for r in posts if any(d.call is caller for d in r.dependant.dependencies)]
    assert len(model) >= 5 * 6  # chat, responses, messages, count_tokens, completions under 6 prefixes
    assert all(isinstance(r, ModelRoute) for r in model)
