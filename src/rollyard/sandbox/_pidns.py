"""The pid namespace of one bwrap run, and how to end it without leaving a zombie on the host.

bwrap runs with ``--as-pid-1``: the command is the namespace's pid 1 and bwrap waits for it. Without
it bwrap forks an init of its own as pid 1, which runs the command as pid 2 and reports its exit
through an eventfd; bwrap exits on that report without waiting for the init, which, still exiting,
was orphaned to the host's init on nearly every exec (20 of 20 in ``tests/sandbox/test_reaping.py``).
The command as pid 1 reaps its own orphans (bash does) or keeps them as zombies inside, counted by
the sandbox's process limit, until it exits and the kernel ends the namespace.

Killing bwrap first orphans that pid 1: ``--die-with-parent``
kills it, and its exit status goes to the host's init, which on some hosts (container and microVM
inits) never reaps, so every killed exec left one zombie there. Killing the namespace's pid 1
first instead has the kernel end every process inside, and bwrap, still alive, reaps it and exits;
we reap bwrap. (Becoming a child subreaper would catch such orphans too, but it also adopts every
unrelated orphan of the process, such as a launched vLLM's workers.)

The pid 1 is held through a pidfd opened while bwrap is checked to be its parent, so a signal can
never reach a process that reused the number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal


def parent_of(pid: int) -> int | None:
    """``pid``'s parent pid from /proc (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: fields resume after the last ')'.
    return int(stat[stat.rindex(b")") + 2 :].split()[1])


class PidNamespace:
    """Watches bwrap's ``--info-fd``, where it writes ``{"child-pid": N}`` right after forking."""

    def __init__(self, info_r: int) -> None:
        self.info_r = info_r
        os.set_blocking(info_r, False)
        self.pidfd = -1  # the namespace's pid 1, while it is bwrap's child
        self._watching = False
        self._info = b""
        self._reported: asyncio.Future[None] | None = None

    def attach(self, bwrap_pid: int) -> None:
        """Start watching the info fd of the bwrap just started as ``bwrap_pid``."""
        loop = asyncio.get_running_loop()
        self._reported = loop.create_future()
        loop.add_reader(self.info_r, self._on_info, bwrap_pid)
        self._watching = True

    def _on_info(self, bwrap_pid: int) -> None:
        try:
            chunk = os.read(self.info_r, 4096)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        self._info += chunk
        try:  # bwrap writes the object in pieces (pid, then namespace ids, then "}")
            info = json.loads(self._info)
        except ValueError:
            if chunk:
                return
            info = {}  # EOF: bwrap died before reporting
        self._stop_watching()
        pid = info.get("child-pid") if isinstance(info, dict) else None
        if isinstance(pid, int) and pid > 1:
            with contextlib.suppress(OSError):
                fd = os.pidfd_open(pid)
                if parent_of(pid) == bwrap_pid:
                    self.pidfd = fd
                else:  # already gone (bwrap reaped it): nothing left to end
                    os.close(fd)
        if self._reported is not None and not self._reported.done():
            self._reported.set_result(None)

    def _stop_watching(self) -> None:
        if self._watching:
            asyncio.get_running_loop().remove_reader(self.info_r)
            self._watching = False

    async def kill(self, bwrap_exited: asyncio.Future[None], timeout: float = 1.0) -> bool:
        """SIGKILL the namespace's pid 1, and with it everything inside, waiting (up to
        ``timeout``) for bwrap to report it unless bwrap exits first. False if there is none."""
        if self._reported is not None and not bwrap_exited.done():
            await asyncio.wait({self._reported, bwrap_exited}, timeout=timeout, return_when="FIRST_COMPLETED")
        return self.kill_now()

    def kill_now(self) -> bool:
        """``kill`` without waiting for the report (for a cancelled exec)."""
        if self.pidfd < 0:
            return False
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)
        return True

    async def wait_gone(self, timeout: float) -> bool:
        """Wait until the namespace's pid 1 has exited (the kernel ends every member of the
        namespace before that); False on timeout."""
        if self.pidfd < 0:
            return True
        loop = asyncio.get_running_loop()
        gone: asyncio.Future[None] = loop.create_future()
        loop.add_reader(self.pidfd, lambda: gone.done() or gone.set_result(None))
        try:
            await asyncio.wait({gone}, timeout=timeout)
            return gone.done()
        finally:
            loop.remove_reader(self.pidfd)

    def close(self) -> None:
        self._stop_watching()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
