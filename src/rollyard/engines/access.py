"""How an engine is reached: the one place that makes HTTP clients carrying the engine key, and
the check in front of every route of the engines rollyard starts.

vLLM's ``--api-key`` guards only ``/v1``-style routes: its dev-mode routes (``/pause``,
``/collective_rpc``, which loads weights from any path) and ``/metrics`` stay open to anything
that reaches the port. So every engine the launcher starts loads ``RequireEngineKey`` (vLLM's
``--middleware``), which answers 401 to any request on any route without the key
(``core.engine_key``), and every rollyard client of an engine sends it. A vLLM started by hand
without the middleware ignores the header; one started with ``--api-key K`` accepts it when
``ROLLYARD_ENGINE_KEY=K``.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from typing import Any

import httpx

from rollyard.core.engine_key import KEY_ENV, engine_headers

MIDDLEWARE = "rollyard.engines.access.RequireEngineKey"


def engine_http(**kw: Any) -> httpx.Client:
    """A synchronous httpx client for engines: ``kw`` as for ``httpx.Client``, plus the key."""
    return httpx.Client(headers={**kw.pop("headers", {}), **engine_headers()}, **kw)


def _digest(value: str) -> bytes:
    return hashlib.sha256(value.encode("utf-8", "surrogatepass")).digest()


_DENIED = json.dumps({"error": "engine key required (Authorization: Bearer ...)"}).encode()


class RequireEngineKey:
    """ASGI middleware run inside the vLLM server (``--middleware``): every HTTP or websocket
    request, on every route, needs ``Authorization: Bearer <ROLLYARD_ENGINE_KEY>``; without the
    variable set, every request is refused (fail closed)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        key = os.environ.get(KEY_ENV)
        self._want = _digest(key) if key else None

    def _allowed(self, scope: dict[str, Any]) -> bool:
        if self._want is None:
            return False
        for name, value in scope.get("headers") or ():
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and secrets.compare_digest(_digest(token), self._want)
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket") or self._allowed(scope):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        headers = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
        await send({"type": "http.response.start", "status": 401, "headers": headers})
        await send({"type": "http.response.body", "body": _DENIED})
