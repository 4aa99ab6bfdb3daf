"""The one place rollyard errors become HTTP error bodies, in the caller's dialect.

OpenAI routes answer ``{"error": {"message", "type", "param", "code"}}``; Anthropic routes
(``/v1/messages...``) answer ``{"type": "error", "error": {"type", "message"}}``. Unexpected
exceptions become a 500 with a generic message (the traceback goes to the log, never the client).
A failed model call of a known program is also written to its journal as a ``request_error``
event (at most ``MAX_ERROR_EVENTS`` per program), so its trajectory says why it has no turn.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import OrderedDict
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from rollyard.core.errors import EngineError, EngineUnavailable, InvalidRequest, RollyardError
from rollyard.core.events import Event, EventKind

log = logging.getLogger(__name__)

MAX_ERROR_EVENTS = 64  # per program: a client retrying a bad call in a loop cannot fill the journal
_PROGRAMS_COUNTED = 4096  # programs whose error-event count is remembered (least recent dropped)

_OPENAI_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "api_error",
    503: "service_unavailable",
}
_ANTHROPIC_TYPE = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    502: "api_error",
    503: "overloaded_error",
}


def is_anthropic(path: str) -> bool:
    return "/v1/messages" in path or path.rstrip("/").endswith("/messages")


def error_body(path: str, status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    if is_anthropic(path):
        return {
            "type": "error",
            "error": {"type": _ANTHROPIC_TYPE.get(status, "api_error"), "message": message},
        }
    kind = _OPENAI_TYPE.get(status, "api_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_response(path: str, status: int, message: str, code: str, param: str | None = None) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    return JSONResponse(error_body(path, status, message, code, param), status_code=status, headers=headers)


def rollyard_error_response(path: str, e: RollyardError) -> JSONResponse:
    resp = error_response(path, e.http_status, e.message, e.code, getattr(e, "param", None))
    retry_after = getattr(e, "retry_after_s", None)
    if retry_after is not None:
        resp.headers["Retry-After"] = str(max(1, round(retry_after)))
    return resp


def _loc(err: dict[str, Any]) -> str:
    """Where a validation error is; keys come from the client, so each is cut short."""
    return ".".join(str(x)[:64] for x in err.get("loc", ()) if x != "body")[:256]


def count_failure(request: Request, e: Exception) -> None:
    """Feed a failed model request to its program's error budget and the error metrics.

    Charged: what the request caused (a 400 of any kind, or an engine failing on it).
    Not charged: auth, conflicts, throttling itself, and an engine being unavailable.
    """
    state = request.app.state
    guard = getattr(state, "guard", None)
    if guard is None:
        return
    if isinstance(e, EngineUnavailable):
        guard.request_errors.labels("engine").inc()
        return
    if not isinstance(e, InvalidRequest | EngineError | RequestValidationError):
        return
    guard.request_errors.labels("request").inc()
    pid = getattr(request.state, "program_id", None)
    if pid is not None:
        before = state.budget.throttled
        state.budget.charge(pid)
        if state.budget.throttled > before:
            guard.throttled.inc()
            log.warning("program throttled program=%s (error budget spent)", pid)


def record_failure(request: Request, status: int, code: str, message: str) -> None:
    """Journal a failed call as an event of its program (when the key names one: a body that
    is not JSON fails before the route's authentication ran, so the key is looked up here)."""
    gateway = getattr(request.app.state, "gateway", None)
    if gateway is None:
        return
    pid = getattr(request.state, "program_id", None)
    if pid is None and status != 401:
        from rollyard.gateway.edge import api_key, on_unix_socket

        try:
            pid = gateway.programs.authenticate(
                api_key(request), request.path_params.get("program_id"), admin_ok=not on_unix_socket(request)
            ).id
        except RollyardError:
            return
    if pid is None:
        return
    counts: OrderedDict[str, int] = request.app.state.__dict__.setdefault("error_events", OrderedDict())
    n = counts.pop(pid, 0)
    counts[pid] = n + 1
    if len(counts) > _PROGRAMS_COUNTED:
        counts.popitem(last=False)
    if n >= MAX_ERROR_EVENTS:
        return
    size = request.headers.get("content-length", "")
    data = {"status": status, "code": code, "message": message[:500], "path": request.url.path[:200]}
    if size.isdigit():
        data["body_bytes"] = int(size)
    try:
        gateway.journal.record_events(
            pid, [Event(kind=EventKind.REQUEST_ERROR, at=gateway.clock.now(), data=data)]
        )
    except (sqlite3.Error, RollyardError) as err:  # the journal's own trouble: the reply still goes
        log.warning("request_error event not recorded program=%s: %s", pid, err)


async def _on_rollyard(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RollyardError)
    count_failure(request, e)
    record_failure(request, e.http_status, e.code, e.message)
    level = logging.WARNING if e.http_status >= 500 else logging.INFO
    log.log(level, "request failed path=%s status=%d code=%s", request.url.path, e.http_status, e.code)
    return rollyard_error_response(request.url.path, e)


async def _on_validation(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, RequestValidationError)
    count_failure(request, e)
    errs = list(e.errors())
    first = errs[0] if errs else {}
    if first.get("type") == "json_invalid":  # with the parser's reason (e.g. nesting too deep)
        reason = str((first.get("ctx") or {}).get("error") or "")[:200]
        message = "request body is not valid JSON" + (f": {reason}" if reason else "")
        record_failure(request, 400, "invalid_json", message)
        return error_response(request.url.path, 400, message, "invalid_json")
    param = _loc(first) or None
    msg = "; ".join(f"{_loc(x) or 'body'}: {str(x.get('msg', 'invalid'))[:200]}" for x in errs[:5])
    record_failure(request, 400, "invalid_request_error", msg)
    return error_response(request.url.path, 400, msg, "invalid_request_error", param)


async def _on_http(request: Request, e: Exception) -> JSONResponse:
    assert isinstance(e, HTTPException)
    code = {404: "not_found", 413: "request_too_large"}.get(e.status_code, "http_error")
    return error_response(request.url.path, e.status_code, str(e.detail), code)


async def _on_disconnect(request: Request, e: Exception) -> Response:
    """The client left while its body was being read (it hung up, or the connection guard cut a
    slow body off): nobody will read an answer, and it is no fault of the gateway's (it was a
    500 with a traceback per slow client)."""
    log.info("client left before its body arrived path=%s", request.url.path)
    return Response(status_code=400)


async def _on_unexpected(request: Request, e: Exception) -> JSONResponse:
    log.exception("unexpected error path=%s", request.url.path)
    return error_response(request.url.path, 500, "internal gateway error (see gateway log)", "internal_error")


def install(app: Any) -> None:
    app.add_exception_handler(RollyardError, _on_rollyard)
    app.add_exception_handler(RequestValidationError, _on_validation)
    app.add_exception_handler(HTTPException, _on_http)
    app.add_exception_handler(ClientDisconnect, _on_disconnect)
    app.add_exception_handler(Exception, _on_unexpected)
