"""What every route needs: the gateway object, the calling program, and small parsing helpers."""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request

from rollyard.core.errors import Forbidden, InvalidRequest
from rollyard.core.program import Program
from rollyard.gateway.service import Gateway
from rollyard.gateway.types import ToolCall

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
    return gateway(request).programs.authenticate(api_key(request), request.path_params.get("program_id"))


def parse_arguments(raw: Any, where: str) -> dict[str, Any] | str:
    """Tool-call arguments as an object; unparsable JSON strings are kept as given."""
    if raw is None:
        return {}
    if isinstance(raw, dict):
        return raw
    if isinstance(raw, str):
        try:
            obj = json.loads(raw) if raw.strip() else {}
        except ValueError:
            return raw
        return obj if isinstance(obj, dict) else raw
    raise InvalidRequest(f"{where}: arguments must be a JSON string or object")


def tool_call(name: Any, arguments: Any, call_id: Any, where: str) -> ToolCall:
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"{where}: a tool call needs a non-empty name")
    return ToolCall(name, parse_arguments(arguments, where), str(call_id or ""))


def text_of(content: Any, where: str, text_types: tuple[str, ...] = ("text",)) -> str:
    """The text of string or content-part content; non-text parts are refused (not silently dropped)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where}: content must be a string or a list of parts")
    out = []
    for i, part in enumerate(content):
        if isinstance(part, str):
            out.append(part)
            continue
        if not isinstance(part, dict):
            raise InvalidRequest(f"{where}[{i}]: a content part must be an object")
        kind = part.get("type", "text")
        if kind in text_types:
            text = part.get("text", "")
            if not isinstance(text, str):
                raise InvalidRequest(f"{where}[{i}].text must be a string")
            out.append(text)
        else:
            raise InvalidRequest(
                f"{where}[{i}]: content type {kind!r} is not supported by this model (text only)"
            )
    return "".join(out)
