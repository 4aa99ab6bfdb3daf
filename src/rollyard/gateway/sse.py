"""Server-sent events framing, and turning a failure mid-stream into an error event."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any

from fastapi.responses import StreamingResponse

from rollyard.core.errors import RollyardError
from rollyard.gateway.errors import error_body

log = logging.getLogger(__name__)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def event(data: Any, name: str | None = None) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data if isinstance(data, str) else _dumps(data)}\n\n"


# Where a ``Frame``'s value goes. A client could send this text too (a model name, say): a
# frame whose other values hold it is then encoded whole at each use.
SLOT = "\x00rollyard-slot\x00"
_SLOT_JSON = _dumps(SLOT)


class Frame:
    """An event sent many times with only a few values changing (a streamed token's text, the
    Responses API's sequence number): encoded once, its slots filled per use.

    ``data`` holds ``SLOT`` where a value goes; ``fill`` takes the values in the order the
    slots appear in the encoded JSON (the dicts' insertion order). The result is exactly
    ``event(data with the values, name)``; only each value is encoded per token instead of the
    whole frame. Should a value of ``data`` itself contain the marker's text (a client's model
    name, say), each use encodes the whole frame instead."""

    def __init__(self, data: dict[str, Any], name: str | None = None) -> None:
        self._data, self._name = data, name
        self._slots = _fill(data, iter(()), count=True)
        if not self._slots:
            raise ValueError("a frame needs at least one SLOT")
        parts = event(data, name).split(_SLOT_JSON)
        self._parts = parts if len(parts) == self._slots + 1 else None

    def fill(self, *values: Any) -> str:
        if len(values) != self._slots:
            raise ValueError(f"this frame has {self._slots} slots, got {len(values)} values")
        if self._parts is None:
            return event(_fill(self._data, iter(values)), self._name)
        parts = self._parts
        out = [parts[0]]
        for value, part in zip(values, parts[1:], strict=True):
            out += (_dumps(value), part)
        return "".join(out)


def _fill(data: Any, values: Iterator[Any], count: bool = False) -> Any:
    """``data`` with each ``SLOT`` replaced by the next value, in encoding order; with
    ``count``, the number of slots instead."""
    if isinstance(data, dict):
        items = [(k, _fill(v, values, count)) for k, v in data.items()]
        return sum(v for _, v in items) if count else dict(items)
    if isinstance(data, list):
        items = [_fill(v, values, count) for v in data]
        return sum(items) if count else items
    if isinstance(data, str) and data == SLOT:
        return 1 if count else next(values)
    return 0 if count else data


def sse_response(path: str, frames: AsyncIterator[str], named_errors: bool) -> StreamingResponse:
    """Stream frames; an error after the headers went out becomes one error event."""

    async def body() -> AsyncIterator[str]:
        try:
            async for f in frames:
                yield f
        except RollyardError as e:
            log.info("stream failed path=%s code=%s", path, e.code)
            yield event(error_body(path, e.http_status, e.message, e.code), "error" if named_errors else None)
        except Exception:
            log.exception("stream failed path=%s", path)
            yield event(
                error_body(path, 500, "internal gateway error", "internal_error"),
                "error" if named_errors else None,
            )

    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return StreamingResponse(body(), media_type="text/event-stream", headers=headers)


class _Primed:
    """The first item, then the rest of ``items``, each ``__anext__`` handed straight to the
    generator's own: no generator layer of its own for every streamed token to pass."""

    def __init__(self, first: Any, it: AsyncIterator[Any]) -> None:
        self._first: list[Any] = [first]
        self._it = it

    def __aiter__(self) -> _Primed:
        return self

    def __anext__(self) -> Awaitable[Any]:
        if self._first:
            return _ready(self._first.pop())
        return self._it.__anext__()


async def _ready(value: Any) -> Any:
    return value


async def primed(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Start a generator now, so errors raised before its first item become HTTP errors."""
    it = aiter(items)
    return _Primed(await anext(it), it)
