"""Server-sent events framing, and turning a failure mid-stream into an error event."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable
from typing import Any, Final

from fastapi.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from rollyard.core.errors import RollyardError
from rollyard.gateway.errors import error_body

log = logging.getLogger(__name__)


# one encoder for every frame: ``json.dumps`` with options builds a new one per call (~2 us
# of the ~5 a streamed token's frame costs); the text is the same
_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
# what that encoder makes of a str (its own first step), without its Python frame: a frame's
# slot is a streamed text piece nearly always
_str_json = json.encoder.encode_basestring


def event(data: Any, name: str | None = None) -> str:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {data if isinstance(data, str) else _dumps(data)}\n\n"


class _Slot:
    """Where a ``Frame``'s value goes: an object, so no client string can ever be taken for it."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "SLOT"

    def __copy__(self) -> _Slot:
        return self

    def __deepcopy__(self, _memo: dict[int, Any]) -> _Slot:
        return self


SLOT: Final = _Slot()


class Frame:
    """An event sent many times with only a few values changing (a streamed token's text, the
    Responses API's sequence number): encoded once, its slots filled per use.

    ``data`` holds ``SLOT`` where a value goes; ``fill`` takes the values in the order the
    slots appear in the encoded JSON (the dicts' insertion order). The result is exactly
    ``event(data with the values, name)``; only each value is encoded per token instead of the
    whole frame. The text around the slots is encoded piece by piece, so the slots are found
    by identity, never by searching the encoded text for a marker a client could also send."""

    def __init__(self, data: dict[str, Any], name: str | None = None) -> None:
        parts = [f"event: {name}\ndata: " if name else "data: "]
        _encode(data, parts)
        parts[-1] += "\n\n"
        self._parts = parts
        self._slots = len(parts) - 1
        if not self._slots:
            raise ValueError("a frame needs at least one SLOT")

    def fill(self, *values: Any) -> str:
        if len(values) != self._slots:
            raise ValueError(f"this frame has {self._slots} slots, got {len(values)} values")
        parts = self._parts
        if len(parts) == 2:  # one slot, a streamed token's text: no list to build and join
            value = values[0]
            return parts[0] + (_str_json(value) if type(value) is str else _dumps(value)) + parts[1]
        out = [parts[0]]
        for value, part in zip(values, parts[1:], strict=True):
            out += (_str_json(value) if type(value) is str else _dumps(value), part)
        return "".join(out)


def _encode(data: Any, parts: list[str]) -> None:
    """Append ``data``'s compact JSON to ``parts[-1]``, starting a new part after each ``SLOT``
    (the same text ``_dumps`` gives, the slots left out)."""
    if data is SLOT:
        parts.append("")
    elif isinstance(data, dict):
        parts[-1] += "{"
        for i, (k, v) in enumerate(data.items()):
            parts[-1] += ("," if i else "") + _dumps(k) + ":"
            _encode(v, parts)
        parts[-1] += "}"
    elif isinstance(data, list):
        parts[-1] += "["
        for i, v in enumerate(data):
            parts[-1] += "," if i else ""
            _encode(v, parts)
        parts[-1] += "]"
    else:
        parts[-1] += _dumps(data)


def sse_response(
    path: str, frames: AsyncIterator[str], named_errors: bool, items: Any = None
) -> StreamingResponse:
    """Stream frames; an error after the headers went out becomes one error event. ``items``:
    what the frames are made from, closed once the stream ends however it ends (see
    ``SSEResponse``)."""
    headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
    return SSEResponse(frames, path, named_errors, headers, items)


class SSEResponse(StreamingResponse):
    """A stream of server-sent events: an error raised while making the frames becomes one
    error event (``path``'s error body, an ``error`` event where ``named_errors``), and the
    stream stops when its client disconnects, watched by one asyncio task.

    The error is caught here, around each frame's making, not in a generator wrapped around
    the frames: that was one layer more for every streamed token to pass, both ways.

    Why the watch: under an ASGI server that does not fail a send to a closed connection (spec_version
    below 2.4, uvicorn's), Starlette watches for the disconnect in an anyio task group with a
    cancel scope: ~55 us per streamed request here against ~5 for one plain task (measured,
    uvloop, 3,000 rounds), a part of a short stream's cost the bare relay does not have. The
    same outcome: on a disconnect the stream is cancelled where it waits (its generators are
    closed, the engine request with them) and the response ends quietly; a cancellation from
    elsewhere (server shutdown) goes on up."""

    def __init__(
        self,
        frames: AsyncIterator[str],
        path: str = "",
        named_errors: bool = False,
        headers: dict[str, str] | None = None,
        items: Any = None,
    ) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=headers)
        self.path, self.named_errors, self._items = path, named_errors, items

    async def stream_response(self, send: Send) -> None:
        """The frames, then the items they were made from closed: a turn's generators yield its
        text as one object the frames read (``gateway.streaming.StreamedText``), so a client that
        leaves mid-stream cancels the frames where they read it, not the turn, which is closed
        here (its engine call's accounting, its program's lock) before the cancel goes on."""
        try:
            await self._frames(send)
        finally:
            if self._items is not None:
                await self._items.aclose()

    async def _frames(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        frames = aiter(self.body_iterator)
        failed = False
        while not failed:
            try:
                frame = await anext(frames)
            except StopAsyncIteration:
                break
            except RollyardError as e:  # the error event is the stream's last
                log.info("stream failed path=%s code=%s", self.path, e.code)
                frame, failed = self._error(e.http_status, e.message, e.code), True
            except Exception:
                log.exception("stream failed path=%s", self.path)
                frame, failed = self._error(500, "internal gateway error", "internal_error"), True
            await send({"type": "http.response.body", "body": frame.encode(), "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def _error(self, status: int, message: str, code: str) -> str:
        return event(error_body(self.path, status, message, code), "error" if self.named_errors else None)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = tuple(map(int, scope.get("asgi", {}).get("spec_version", "2.0").split(".")))
        if scope["type"] != "http" or version >= (2, 4) or self.background is not None:
            await super().__call__(scope, receive, send)
            return
        streaming = asyncio.current_task()
        assert streaming is not None
        state = {"cut": False, "done": False}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass

        def gone(w: asyncio.Task[None]) -> None:
            # a callback, run between the stream's steps: it is waiting (or done: nothing to cut)
            if not state["done"] and not w.cancelled() and w.exception() is None:
                state["cut"] = True
                streaming.cancel()

        watcher = asyncio.get_running_loop().create_task(watch())
        watcher.add_done_callback(gone)
        taken = False  # our cancel taken back: the request's task counts no cancel of ours
        try:
            await self.stream_response(send)
        except asyncio.CancelledError:
            if not state["cut"]:
                raise
            # ours (the client left, nothing more to send) unless a cancel from elsewhere
            # (server shutdown) came too: that one goes on up
            taken = True
            if streaming.uncancel() > 0:
                raise
        finally:
            state["done"] = True
            watcher.cancel()
            if state["cut"] and not taken:  # absorbed where it landed, or another error won
                streaming.uncancel()


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

    async def aclose(self) -> None:
        close = getattr(self._it, "aclose", None)
        if close is not None:
            await close()


async def _ready(value: Any) -> Any:
    return value


async def primed(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Start a generator now, so errors raised before its first item become HTTP errors."""
    it = aiter(items)
    return _Primed(await anext(it), it)
