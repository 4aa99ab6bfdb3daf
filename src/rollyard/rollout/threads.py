"""Blocking work (a training step, an SFT run) that Ctrl-C does not have to wait for.

``asyncio.to_thread`` runs on the loop's default executor, and ``asyncio.run`` joins that
executor on the way out: a Ctrl-C during a long training step then waits for the step to
end (minutes on a loaded laptop). Here the work runs in a daemon thread; a cancelled caller
stops waiting at once and the process can exit. Safe because checkpoints are written only
between steps, atomically, so an abandoned step leaves nothing half-written.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


async def in_daemon_thread(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, error: BaseException | None) -> None:
        if fut.done():  # the caller was cancelled meanwhile
            return
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)  # type: ignore[arg-type]

    def work() -> None:
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # handed to the awaiting task, not swallowed
            if not loop.is_closed():
                loop.call_soon_threadsafe(settle, None, e)
            return
        if not loop.is_closed():
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=work, name=getattr(fn, "__name__", "work"), daemon=True).start()
    return await fut
