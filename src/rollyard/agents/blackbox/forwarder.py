"""Forward TCP connections on 127.0.0.1:PORT to a unix socket (stdlib only).

Shipped into black-box sandboxes and run there with the host's Python bound read-only: inside
the sandbox's own network namespace, loopback is the only network, and this forwarder is the
only way out of it, to the program's endpoint on the gateway's unix socket.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path

Connect = Callable[[], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()  # half-close: the other direction may still be answering
    except (ConnectionError, OSError):
        writer.close()


async def splice(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter, connect: Connect) -> None:
    """Pass one client connection, both ways and byte for byte, to a new ``connect()`` upstream
    (also the relay of ``relay.py``, upstream over TCP)."""
    try:
        up_r, up_w = await connect()
    except OSError:
        client_w.close()
        return
    await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
    for w in (client_w, up_w):
        with contextlib.suppress(Exception):
            w.close()


async def serve(port: int, socket_path: str, ready: Path | None) -> None:
    server = await asyncio.start_server(
        lambda r, w: splice(r, w, lambda: asyncio.open_unix_connection(socket_path)), "127.0.0.1", port
    )
    if ready is not None:
        ready.write_text(str(port))
    async with server:
        await server.serve_forever()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--socket", required=True)
    ap.add_argument("--ready", type=Path, default=None, help="file written once listening")
    args = ap.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.socket, args.ready))


if __name__ == "__main__":
    main()
