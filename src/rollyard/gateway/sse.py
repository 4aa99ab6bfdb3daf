"""Server-sent events framing, and turning a failure mid-stream into an error event."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
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


async def primed(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """Start a generator now, so errors raised before its first item become HTTP errors."""
    it = aiter(items)
    first = await anext(it)

    async def chain() -> AsyncIterator[Any]:
        yield first
        async for x in it:
            yield x

    return chain()
