"""The route class of the model endpoints: FastAPI's declaration, a lean request path.

Every model endpoint has one shape, ``async def f(body: SomeBody, request, program=Depends(caller))``.
FastAPI still reads that signature for ``/openapi.json`` (so the documented schema is the typed
body), but the request itself skips FastAPI's general machinery (dependency solving, field
wrappers, response-model encoding), which cost more CPU per call than the gateway's own work:
the body is parsed by pydantic-core from bytes, the caller is authenticated, the body model is
validated, and the endpoint is called. Errors take the same path as before (a JSON error or a
shape mismatch is a ``RequestValidationError``, answered by ``errors`` in the API's dialect).
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError

from rollyard.core.errors import InvalidRequest
from rollyard.core.program import Program
from rollyard.gateway.bodies.common import Body
from rollyard.gateway.body_prefix import BodyPrefix, Extension, Seen, advance, extend
from rollyard.gateway.edge import FastJSONResponse, api_key, caller
from rollyard.gateway.limits import strict_json


def body_model(endpoint: Callable[..., Any]) -> type[BaseModel] | None:
    """The type of the endpoint's ``body`` parameter, if it has one."""
    model = typing.get_type_hints(endpoint).get("body")
    if model is not None and not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise TypeError(f"{endpoint.__name__}: a model endpoint's body is a pydantic model")
    return model


def _invalid(e: ValidationError) -> RequestValidationError:
    """FastAPI's error shape: locations start at ``body``."""
    errors = e.errors(include_url=False, include_context=False, include_input=False)
    return RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in errors])


STRINGS_PER_OBJECT = 8  # strings a body may hold per allowed object before brackets in them count


def count_objects(raw: bytes, limit: int) -> int:
    """The JSON objects and arrays in ``raw``, counted in C without parsing it: every bracket
    first (~10 ms for 8 MB); over ``limit``, those outside strings only (escaped quotes and
    backslashes dropped, then every other piece between quotes), unless the body has so many
    strings that separating them would cost what parsing does: then the first count stands."""
    n = raw.count(b"{") + raw.count(b"[")
    if n <= limit or raw.count(b'"') > 2 * STRINGS_PER_OBJECT * limit:
        return n
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    outside = b"".join(text.split(b'"')[::2])
    return outside.count(b"{") + outside.count(b"[")


def check_objects(raw: bytes, limit: int) -> None:
    """Refuse a body with more than ``limit`` objects and arrays before it is parsed: parsing and
    validating run on the event loop at ~2 us an object."""
    n = count_objects(raw, limit)
    if n > limit:
        raise InvalidRequest(
            f"too many JSON objects and arrays in the request body (gateway.limits.max_body_objects, "
            f"--max-body-objects: {limit}); it has {n}",
            code="too_many_objects",
        )


def _parsed(raw: bytes, max_objects: int) -> Any:
    """The whole body's JSON, counted first. Strict JSON: invalid UTF-8, lone surrogates,
    NaN/Infinity and numbers out of range are refused here."""
    check_objects(raw, max_objects)
    try:
        return strict_json(raw)
    except ValueError as e:  # the parser's reason, as FastAPI's own json_invalid carries it
        err = {
            "type": "json_invalid",
            "loc": ("body", 0),
            "msg": "JSON decode error",
            "ctx": {"error": str(e)},
        }
        raise RequestValidationError([err]) from None


def _validated(model: type[BaseModel], data: Any) -> BaseModel:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _invalid(e) from None


def _extension(
    raw: bytes, request: Request, model: type[BaseModel], max_objects: int
) -> tuple[str | None, Extension | None]:
    """The program the key shown names, and the body parsed past that program's previous one
    when it extends it (a hint: the request is authenticated after, as on the full path, and the
    hint is dropped unless the authenticated program is the one it was looked up for)."""
    key = api_key(request)
    gw = request.app.state.gateway
    pid = gw.programs.id_for_key(key) if key else None
    return pid, None if pid is None else extend(raw, gw.body_prefixes.get(pid), model, max_objects)


def _validated_extension(model: type[BaseModel], ext: Extension, raw: bytes, max_objects: int) -> BaseModel:
    """Only the new messages (and the other fields) validated; the known ones put before them.
    Invalid: the whole body is validated, for the error a full parse gives (its locations)."""
    try:
        body = model.model_validate(ext.data)
    except ValidationError:
        return _validated(model, _parsed(raw, max_objects))
    body.messages = ext.known.messages + body.messages  # type: ignore[attr-defined]
    return body


def _remember(
    raw: bytes,
    body: BaseModel,
    ext: Extension | None,
    prefixes: dict[str, BodyPrefix | Seen],
    program: Program,
) -> None:
    """Keep this body (its prefix once an extended one, else the body to locate it in when the
    next one comes) for the program's next, and hand the body the known prefix (its dialect
    reuses the messages it made of it)."""
    messages = body.messages  # type: ignore[attr-defined]
    made: BodyPrefix | Seen | None = (
        Seen(type(body), raw, messages) if ext is None else advance(ext, messages)
    )
    if made is None or program.state.is_over:  # a finished program's state is freed, not kept
        prefixes.pop(program.id, None)
    else:
        prefixes[program.id] = made
    if isinstance(body, Body):
        body.set_prefixes(None if ext is None else ext.known, made)


class ModelRoute(APIRoute):
    """A model endpoint: body parsed strictly from bytes, caller authenticated, endpoint called.

    An endpoint without a body (``GET /v1/models``) keeps FastAPI's own handling."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        endpoint = self.endpoint
        model = body_model(endpoint)
        if model is None:
            return super().get_route_handler()
        calls = [d.call for d in self.dependant.dependencies]
        if calls != [caller]:  # the lean path runs `caller` and nothing else
            raise TypeError(f"{endpoint.__name__}: a model endpoint depends on `caller` only, not {calls}")

        chat = "messages" in model.model_fields  # bodies that resend a growing history

        async def handle(request: Request) -> Response:
            raw = await request.body()
            state = request.app.state
            limit = state.limits.max_body_objects
            pid, ext = _extension(raw, request, model, limit) if chat else (None, None)
            data = _parsed(raw, limit) if ext is None else None
            program = await caller(request)
            if ext is not None and program.id != pid:  # never another program's messages
                ext, data = None, _parsed(raw, limit)
            body = _validated(model, data) if ext is None else _validated_extension(model, ext, raw, limit)
            if chat:
                _remember(raw, body, ext, state.gateway.body_prefixes, program)
            out = await endpoint(body, request, program)
            return out if isinstance(out, Response) else FastJSONResponse(out)

        return handle
