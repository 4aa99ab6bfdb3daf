"""Blocking work in a daemon thread: results and errors come back; cancelling does not wait."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from rollyard.rollout.threads import in_daemon_thread


async def test_result_and_error_are_delivered() -> None:
    assert await in_daemon_thread(lambda a, b: a + b, 2, b=3) == 5

    def boom() -> None:
        raise ValueError("bad batch")

    with pytest.raises(ValueError, match="bad batch"):
        await in_daemon_thread(boom)


async def test_a_cancelled_caller_stops_waiting_at_once() -> None:
    release = threading.Event()
    task = asyncio.create_task(in_daemon_thread(release.wait, 30))
    await asyncio.sleep(0.05)
    t0 = time.monotonic()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert time.monotonic() - t0 < 1.0
    worker = [t for t in threading.enumerate() if t.name == "wait"]
    assert worker and all(t.daemon for t in worker)  # it cannot hold the interpreter open
    release.set()
