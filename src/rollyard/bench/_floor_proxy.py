"""The least a Python HTTP hop can do: relay ``POST /v1/completions`` bytes to one engine
(a streamed answer piece by piece, as it arrives).

``rollyard bench gateway`` runs it beside the gateway as a floor: same server stack (uvicorn
with uvloop and httptools when installed), same client (aiohttp, pooled), no parsing, rendering,
scheduling or journal. What it adds over the direct path, on the same shared cores, is what any
Python proxy adds before the gateway does any work of its own.

    python -m rollyard.bench._floor_proxy --engine URL --port PORT
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import uvicorn

from rollyard.core.engine_key import engine_headers
from rollyard.engines.canned import read_body


def make_app(engine_url: str) -> Any:
    """A raw ASGI app (no framework): read the body, post it upstream, send the answer back."""
    session: aiohttp.ClientSession | None = None
    target = engine_url.rstrip("/") + "/v1/completions"

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        nonlocal session
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            if session is not None:
                await session.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = await read_body(receive)
        if session is None:
            # idle connections dropped before the engine's server (uvicorn: 5 s) closes them: one
            # reused as it closed failed a relayed request (the history levels leave it idle)
            session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4096, keepalive_timeout=3.0))
        headers = {"content-type": "application/json", **engine_headers()}
        async with session.post(target, data=body, headers=headers) as r:
            kind = r.headers.get("content-type", "application/json").encode()
            await send(
                {"type": "http.response.start", "status": r.status, "headers": [(b"content-type", kind)]}
            )
            if not kind.startswith(b"text/event-stream"):
                await send({"type": "http.response.body", "body": await r.read()})
                return
            async for chunk in r.content.iter_any():  # a stream: each piece on as it comes
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    return app


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", required=True)
    p.add_argument("--port", type=int, required=True)
    a = p.parse_args()
    uvicorn.run(make_app(a.engine), host="127.0.0.1", port=a.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
