"""Connection-level limits uvicorn does not set: slow and oversized requests, connections per peer.

uvicorn waits for a request's headers and body without end (its keep-alive timer runs only
between requests, and any byte cancels it), accepts headers of any size with httptools, and
accepts any number of connections from one address: ~21,000 idle partial connections (no key
needed) exhausted the gateway's descriptors and new connections were reset. This protocol (uvicorn's
httptools one, subclassed) closes a connection whose request headers have not arrived within
``header_timeout_s`` of its first byte (or of the connection, if nothing came), or whose body has
not arrived within ``body_timeout_s`` of its headers; answers 431 to headers over
``max_header_bytes``; and closes at once a TCP connection beyond ``max_conns_per_peer`` from one
address (the sandboxes' unix socket is not capped: every sandbox is the same peer there). The
application's own time is not limited here (a request waiting for the engine is no slow client).
A deadline that comes due while the kernel holds bytes the loop has not read yet (a loop late by
more than the timeout: libuv runs due timers before it reads sockets) is looked at once more
after the loop has read them, so a stalled loop does not cut off clients that were on time.
Each server's ``Census`` of open connections returns the memory of a surge once it has closed.
"""

from __future__ import annotations

import asyncio
import fcntl
import logging
import struct
import termios
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from rollyard.core.heap import release_free_heap
from rollyard.gateway.settings import GatewayLimits

log = logging.getLogger(__name__)

_IDLE, _HEADERS, _BODY, _APP = range(4)
LATE_LOOK_S = 0.05
TRIM_AFTER, TRIM_SETTLE_S = 1000, 2.0
IDLE_TRIM_S = 30.0  # no connection open this long: the heap's free pages go back too


def _unread_bytes(transport: asyncio.Transport) -> int:
    """Bytes the kernel holds for this connection that the loop has not read yet (0 if unknown)."""
    sock = transport.get_extra_info("socket")
    if sock is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0"))[0]
    except (OSError, ValueError):
        return 0


class Census:
    """One server's open connections. After a surge (``TRIM_AFTER`` connections closed since the
    most held) the C heap's free pages go back to the system, once the closes have settled: the
    memory thousands of connections took (parsers, transports, buffers: ~6 KB each) stays in the
    allocator after they close (a surge of 3,000 idle connections kept the gateway ~35 MB
    larger for good; more surges reuse it, they do not add to it). Also once no connection has
    been open for ``IDLE_TRIM_S``: the heap a gateway keeps for its next turns' buffers
    (``gateway.heap``, up to 16 MiB free at each arena's top) is of no use to an idle one."""

    def __init__(self) -> None:
        self.open = self.peak = self.trims = self.idle_trims = 0
        self._trim: asyncio.Handle | None = None
        self._idle: asyncio.Handle | None = None

    def opened(self) -> None:
        self.open += 1
        self.peak = max(self.peak, self.open)
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def closed(self, loop: asyncio.AbstractEventLoop) -> None:
        self.open -= 1
        if self.peak - self.open >= TRIM_AFTER and self._trim is None:
            self._trim = loop.call_later(TRIM_SETTLE_S, self._trim_now, loop)
        if self.open == 0 and self._idle is None:
            self._idle = loop.call_later(IDLE_TRIM_S, self._idle_now, loop)

    def _idle_now(self, loop: asyncio.AbstractEventLoop) -> None:
        self._idle = None
        self.idle_trims += 1
        log.info("no connection for %.0f s: trimming the heap (idle trim %d)", IDLE_TRIM_S, self.idle_trims)
        loop.run_in_executor(None, release_free_heap)

    def _trim_now(self, loop: asyncio.AbstractEventLoop) -> None:
        log.info(
            "%d connections closed since %d were open: trimming the heap (trim %d)",
            self.peak - self.open,
            self.peak,
            self.trims + 1,
        )
        self._trim, self.peak = None, self.open
        self.trims += 1
        loop.run_in_executor(None, release_free_heap)  # ctypes lets go of the GIL while it runs


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits above (class attributes, see ``guarded``)."""

    header_timeout_s: float
    body_timeout_s: float
    max_header_bytes: int
    max_conns_per_peer: int
    per_peer: dict[str, int]
    census: Census

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase = _IDLE
        self._head_bytes = 0
        self._deadline: asyncio.TimerHandle | None = None
        self._late_looked = False
        self._peer: str | None = None

    def _arm(self, seconds: float) -> None:
        self._late_looked = False
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._phase == _APP or self.transport.is_closing():
            return
        if not self._late_looked and _unread_bytes(self.transport):
            # The bytes came in time, but the loop was late (libuv runs due timers before it
            # reads sockets): look again once it has read them, before cutting anyone off.
            self._late_looked = True
            self._deadline = self.loop.call_later(LATE_LOOK_S, self._too_slow)
            return
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self.census.opened()
        peer = self.client[0] if self.client else None
        if peer is not None:
            if self.per_peer.get(peer, 0) >= self.max_conns_per_peer:
                transport.abort()
                return
            self.per_peer[peer] = self.per_peer.get(peer, 0) + 1
            self._peer = peer
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.census.closed(self.loop)
        if self._peer is not None:
            left = self.per_peer.get(self._peer, 1) - 1
            if left > 0:
                self.per_peer[self._peer] = left
            else:
                self.per_peer.pop(self._peer, None)
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._phase == _IDLE:
            self._phase, self._head_bytes = _HEADERS, 0
            self._arm(self.header_timeout_s)
        if self._phase == _HEADERS:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._phase == _HEADERS and self._head_bytes > self.max_header_bytes:
            self._disarm()
            self._refuse_headers()

    def _refuse_headers(self) -> None:
        if self.transport.is_closing():
            return
        body = f"request headers over the gateway's limit of {self.max_header_bytes} bytes\n".encode()
        self.transport.write(
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
            b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
        )
        self.transport.close()

    def on_headers_complete(self) -> None:
        self._phase = _BODY
        self._arm(self.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._phase = _APP
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        self._phase = _IDLE  # the keep-alive timer (uvicorn's) now runs until the next byte
        super().on_response_complete()


def guarded(limits: GatewayLimits) -> type[GuardedProtocol]:
    """A protocol class for one server: its limits, and its own count of connections per peer."""
    attrs = {
        "header_timeout_s": limits.header_timeout_s,
        "body_timeout_s": limits.body_timeout_s,
        "max_header_bytes": limits.max_header_bytes,
        "max_conns_per_peer": limits.max_conns_per_peer,
        "per_peer": {},
        "census": Census(),
    }
    return type("GuardedProtocol", (GuardedProtocol,), attrs)
