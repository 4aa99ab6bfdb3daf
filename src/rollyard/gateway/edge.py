"""What every route needs: the gateway object, the calling program, and small parsing helpers."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import pydantic_core
from fastapi import Request
from fastapi.responses import JSONResponse

from rollyard.core.errors import Forbidden, InvalidRequest, NotFound, RateLimited
from rollyard.core.json_text import read_json
from rollyard.core.program import Program
from rollyard.gateway.service import Gateway
from rollyard.gateway.types import ToolCall

# Program ids: letters, digits, ``_``, ``-`` and single inner dots; never ``.``, ``..`` or a
# leading dot (ids name journal rows and may name files and URL segments).
PROGRAM_ID = r"^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$"
_PROGRAM_ID = re.compile(PROGRAM_ID)

# Route prefixes: with or without /v1 in the base URL an agent was given (a base URL that
# already ends in /v1 makes the Anthropic SDK call /v1/v1/messages), and the /p/{id} form.
# No two prefixes can match the same path, so the order only sets how many routes a request
# is matched against: the usual one (/v1) first.
PREFIXES = ("/v1", "", "/v1/v1", "/p/{program_id}", "/p/{program_id}/v1", "/p/{program_id}/v1/v1")


def gateway(request: Request) -> Gateway:
    return request.app.state.gateway  # type: ignore[no-any-return]


def api_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth[:7].lower() == "bearer ":
        return auth[7:].strip() or None
    return request.headers.get("x-api-key") or None


def on_unix_socket(request: Request) -> bool:
    """True for a connection on the gateway's unix socket (uvicorn reports its server as (path, None))."""
    server = request.scope.get("server")
    return server is not None and server[1] is None


async def not_on_sandbox_socket(request: Request) -> None:
    """The unix socket is the sandboxes' door: model endpoints only, whatever key is shown."""
    if on_unix_socket(request):
        raise Forbidden("this endpoint is not served on the gateway's sandbox socket")


async def caller(request: Request) -> Program:
    """The program a model request acts for (FastAPI dependency)."""
    pid = request.path_params.get("program_id")
    if pid is not None and (len(pid) > 64 or not _PROGRAM_ID.match(pid)):
        raise NotFound("no such program (program ids are letters, digits, '_', '-' and inner dots)")
    program = gateway(request).programs.authenticate(
        api_key(request), pid, admin_ok=not on_unix_socket(request)
    )
    request.state.program_id = program.id
    request.app.state.idle.touch(program.id)
    wait = request.app.state.budget.wait_s(program.id)
    if wait > 0:
        raise RateLimited(
            f"program {program.id} is throttled: too many of its requests failed recently "
            f"(gateway error budget); retry in {wait:.0f}s",
            retry_after_s=wait,
        )
    return program


class FastJSONResponse(JSONResponse):
    """A JSON answer serialized by pydantic-core (~2x ``json.dumps`` on a chat completion)."""

    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content)


def parse_arguments(raw: dict[str, Any] | str | None) -> dict[str, Any] | str:
    """Tool-call arguments as an object; unparsable JSON strings are kept as given."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    obj = read_json(raw) if raw.strip() else {}
    return obj if isinstance(obj, dict) else raw  # UNREADABLE too


def tool_call(name: str, arguments: dict[str, Any] | str | None, call_id: str | None) -> ToolCall:
    return ToolCall(name, parse_arguments(arguments), call_id or "")


def text_of(content: str | Sequence[Any] | None, where: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """The text of string or (typed) content-part content; non-text parts are refused, not dropped."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    out = []
    for i, part in enumerate(content):
        if part["type"] not in text_types:
            raise InvalidRequest(
                f"{where}[{i}]: content type {part['type']!r} is not supported by this model (text only)"
            )
        out.append(part["text"])
    return "".join(out)
