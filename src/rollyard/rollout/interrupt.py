"""Ctrl-C for a whole run: one orderly, bounded teardown; a second Ctrl-C forces the exit.

The first SIGINT (or SIGTERM) cancels the run's main task, so every ``finally`` and context
manager tears down in reverse order (programs, gateway, sandboxes, engines) and the run dir
keeps its last checkpoint. Teardown is bounded: a second signal, or ``grace_s`` passing, runs
the registered last-resort kills (engine process groups, which live in their own sessions and
so would not die with us) and leaves with ``os._exit(130)``, skipping whatever still waits.

The handler is installed with ``signal.signal`` on purpose, whatever disposition was inherited:
a parent that ignores SIGINT (``cmd &`` in a non-interactive shell, or a test runner in such a
shell) passes SIG_IGN down through exec, and then ``asyncio.run`` installs no handler of its own;
a signal sent with ``kill -INT`` must still stop the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import FrameType
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

EXIT_CODE = 130  # 128 + SIGINT, what a shell reports for a Ctrl-C'd command

_force_hooks: dict[int, Callable[[], None]] = {}
_hook_ids = iter(range(1, 1 << 62))


@contextlib.contextmanager
def on_forced_exit(fn: Callable[[], None]) -> Iterator[None]:
    """While the block runs, ``fn`` is called (from any thread) before a forced exit.

    For what must not outlive the process even when teardown is skipped; ``fn`` must be quick
    and non-blocking (e.g. SIGKILL a process group)."""
    key = next(_hook_ids)
    _force_hooks[key] = fn
    try:
        yield
    finally:
        _force_hooks.pop(key, None)


def force_exit(reason: str) -> None:
    """Run the last-resort hooks, then log, flush and leave now (no atexit, no thread joins)."""
    for fn in list(_force_hooks.values()):  # first: nothing below may stop them from running
        with contextlib.suppress(Exception):
            fn()
    with contextlib.suppress(Exception):
        log.error("forced exit: %s", reason)
        logging.shutdown()
        sys.stderr.write(f"rollyard: {reason}; forced exit\n")
        sys.stderr.flush()
    os._exit(EXIT_CODE)


class InterruptGuard:
    """SIGINT/SIGTERM handling for one ``asyncio.run`` of a command; see the module docstring."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.interrupted = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._finished = threading.Event()  # the command ended without a signal: no watchdog

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.interrupted:
            force_exit(f"{name} during teardown")
        self.interrupted = True
        log.warning("%s: stopping the run (teardown up to %.0f s; Ctrl-C again to force)", name, self.grace_s)
        threading.Thread(target=self._watchdog, name="teardown-watchdog", daemon=True).start()
        loop, task = self._loop, self._task
        if loop is None or task is None or loop.is_closed():
            raise KeyboardInterrupt  # outside the run's main task: the plain behaviour
        loop.call_soon_threadsafe(task.cancel)

    def _watchdog(self) -> None:
        # Armed until the process is gone: the exit itself (thread joins, atexit) is bounded too.
        if not self._finished.wait(self.grace_s):
            force_exit(f"teardown took longer than {self.grace_s:.0f} s")

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """``asyncio.run(main)`` with this guard owning SIGINT and SIGTERM; KeyboardInterrupt
        if a signal stopped it (after the orderly teardown)."""

        async def guarded() -> T:
            self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
            try:
                return await main
            finally:
                self._task = None

        old = {sig: signal.signal(sig, self._handle) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return asyncio.run(guarded())
        except asyncio.CancelledError:
            if self.interrupted:
                raise KeyboardInterrupt from None
            raise
        finally:
            if not self.interrupted:  # else the process is on its way out: keep both guards
                self._finished.set()
                for sig, handler in old.items():
                    signal.signal(sig, handler)
