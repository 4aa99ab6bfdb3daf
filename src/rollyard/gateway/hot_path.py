"""The model endpoints' short way in: one dict lookup instead of Starlette's whole stack.

Nearly every request a gateway serves is a ``POST`` to a model endpoint (chat completions,
responses, messages, ...) under one of the API prefixes. Through FastAPI each of them passed
about a dozen ASGI layers (error middleware, the body limit, exception middleware, three
``AsyncExitStack``\\ s, the router trying routes one by one, two ``send`` wrappers per message),
and every resumption of the handler's coroutine went back through all of them: measured with
the canned engine, ~12% of the gateway's CPU per request went there.

``GatewayApp`` serves those requests itself: the path is looked up in a table built from the
app's own routes (``ModelRoute`` endpoints with a body), the route's lean handler is called
with a plain ``Request``, and an exception is answered by the app's own exception handlers,
exactly as the stack would have (a handled type gets its handler's answer; anything else gets
the ``Exception`` handler's 500 and is raised on, for the server to log). A request that is not
plainly in bounds takes the full stack unchanged: no ``Content-Length`` (a chunked body is
counted by ``BodyLimit``), one over the limit (``BodyLimit``'s 413), a ``root_path``, any
other method or path. So the body limit, the error bodies of each dialect, the sandbox socket
rules (admin routes are never on the short way) and ``/openapi.json`` are the stack's own.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from rollyard.gateway.limits import declared_length
from rollyard.gateway.model_route import ModelRoute, body_model

Handler = Callable[[Request], Awaitable[Response]]
ErrorHandler = Callable[[Request, Exception], Awaitable[Response]]
# Starlette's path parameters match one segment; the program prefixes are "/p/{program_id}...".
_PROGRAM_PREFIX = "/p/{program_id}"


class GatewayApp(FastAPI):
    """A FastAPI app whose model endpoints are served without the middleware stack.

    ``max_body_bytes`` must be the limit ``BodyLimit`` enforces: a declared length over it
    goes to the stack, which refuses it."""

    max_body_bytes: int = 0
    _hot: dict[str, tuple[APIRoute, Handler]] | None = None

    def _hot_table(self) -> dict[str, tuple[APIRoute, Handler]]:
        """Route path -> (route, lean handler), for every model endpoint taking a POST body.

        Built on the first request, like Starlette's middleware stack, from the routes the app
        has then; the first route of a path wins, as in the router."""
        table: dict[str, tuple[APIRoute, Handler]] = {}
        for route in self.router.routes:
            if not isinstance(route, ModelRoute) or "POST" not in (route.methods or ()):
                continue
            if body_model(route.endpoint) is None or route.path in table:
                continue
            params = set(route.param_convertors)
            if params and (params != {"program_id"} or not route.path.startswith(_PROGRAM_PREFIX + "/")):
                continue
            table[route.path] = (route, route.get_route_handler())
        return table

    def _lookup(self, path: str) -> tuple[APIRoute, Handler, dict[str, Any]] | None:
        if self._hot is None:
            self._hot = self._hot_table()
        if path.startswith("/p/"):
            pid, slash, rest = path[3:].partition("/")
            if not pid or not slash:
                return None
            hit = self._hot.get(f"{_PROGRAM_PREFIX}/{rest}")
            return None if hit is None else (*hit, {"program_id": pid})
        hit = self._hot.get(path)
        return None if hit is None else (*hit, {})

    def _in_bounds(self, scope: Scope) -> bool:
        """A declared ``Content-Length`` within the limit (read as ``BodyLimit`` reads it)."""
        declared = declared_length(scope)
        return declared is not None and declared <= self.max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and not scope.get("root_path")
            and not self.root_path
            and self.max_body_bytes
        ):
            hit = self._lookup(scope["path"])
            if hit is not None and self._in_bounds(scope):
                route, handler, params = hit
                scope["app"] = self
                scope["router"] = self.router
                scope["route"], scope["endpoint"], scope["path_params"] = route, route.endpoint, params
                await self._serve(handler, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve(self, handler: Handler, scope: Scope, receive: Receive, send: Send) -> None:
        """Call the handler; map its exception as ``ExceptionMiddleware`` and
        ``ServerErrorMiddleware`` do. An error once the answer has started (a stream) goes to
        the server, as it does through the stack."""
        request = Request(scope, receive, send)
        try:
            response = await handler(request)
        except Exception as exc:
            on_error, unexpected = self._handler_for(exc)
            await (await on_error(request, exc))(scope, receive, send)
            if unexpected:
                raise
            exc.__traceback__ = None  # as Starlette: a reused exception would pile up tracebacks
            return
        await response(scope, receive, send)

    def _handler_for(self, exc: Exception) -> tuple[ErrorHandler, bool]:
        """The handler the stack would pick: a status handler for an ``HTTPException``, then the
        nearest class in the exception's MRO; ``Exception``/500 is the last resort (True)."""
        handlers = self.exception_handlers
        if isinstance(exc, HTTPException) and exc.status_code in handlers and exc.status_code != 500:
            return handlers[exc.status_code], False
        for cls in type(exc).__mro__:
            if cls is Exception:
                break
            if cls in handlers:
                return handlers[cls], False
        last = handlers.get(500) or handlers.get(Exception)
        if last is None:  # nothing installed: what the stack's own default would do
            raise exc
        return last, True
