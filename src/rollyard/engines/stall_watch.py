"""A streamed answer whose bytes stop coming fails, with one timer per stream.

aiohttp's ``sock_read`` timeout does the same by cancelling and re-arming a timer on every read
from the socket: for a stream that is a timer per token. In the gateway that was ~3% of its CPU
per streamed request (64 streams at once, canned engine, A/B in one run), work the bare relay it
is measured against does not do. Here the stream's reader is checked every quarter of the
timeout; four checks in a row that find no new byte fail it, so a stall is caught between 1 and
1.25 timeouts after its last byte.
"""

from __future__ import annotations

import asyncio

import aiohttp

__all__ = ["StallWatch"]

_CHECKS = 4  # checks per timeout


class StallWatch:
    """Fails ``content`` (its pending and next reads raise ``TimeoutError``) once no byte has
    arrived for ``timeout_s``; ``cancel`` when the stream ends."""

    def __init__(self, content: aiohttp.StreamReader, timeout_s: float) -> None:
        self._content = content
        self._timeout_s = timeout_s
        self._seen = content.total_bytes
        self._idle = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_later(timeout_s / _CHECKS, self._check)

    def _check(self) -> None:
        total = self._content.total_bytes
        if total != self._seen:
            self._seen, self._idle = total, 0
        else:
            self._idle += 1
        if self._idle >= _CHECKS:
            self._content.set_exception(TimeoutError(f"no byte for {self._timeout_s:g} s"))
            return
        self._handle = self._loop.call_later(self._timeout_s / _CHECKS, self._check)

    def cancel(self) -> None:
        self._handle.cancel()
