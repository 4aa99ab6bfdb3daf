"""Run one host process with a wall-clock deadline and capped output, killing its whole group.

Shared by the providers: each builds an argv (bwrap's, or a plain shell's) and hands it here.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass, field

from rollyard.core.errors import SandboxError
from rollyard.sandbox.base import ExecResult

RUNAWAY_FACTOR = 64  # output beyond cap x this is a runaway: the command is killed, not drained


@dataclass
class _Capture:
    cap: int
    kept: bytearray = field(default_factory=bytearray)
    total: int = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]


async def _pump(stream: asyncio.StreamReader, cap: _Capture, runaway: asyncio.Event) -> None:
    while chunk := await stream.read(1 << 16):
        cap.add(chunk)
        if cap.total > cap.cap * RUNAWAY_FACTOR:
            runaway.set()
            return


def kill_group(pid: int) -> None:
    """SIGKILL a process group; bwrap's --die-with-parent then takes its pid namespace down."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def run_capped(
    argv: list[str],
    *,
    timeout: float,
    output_bytes: int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    user: int | None = None,
) -> ExecResult:
    """Run ``argv``; on timeout or runaway output kill its process group. Never raises for the
    command's own failure, only when it cannot be started."""
    t0 = time.perf_counter()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
        )
    except OSError as e:
        raise SandboxError(f"cannot start {argv[0]!r}: {e}") from e
    assert proc.stdout is not None and proc.stderr is not None
    out, err = _Capture(output_bytes), _Capture(output_bytes)
    runaway = asyncio.Event()
    pumps = asyncio.gather(_pump(proc.stdout, out, runaway), _pump(proc.stderr, err, runaway))
    waiter = asyncio.ensure_future(proc.wait())
    stop = asyncio.ensure_future(runaway.wait())
    timed_out = False
    try:
        done, _ = await asyncio.wait({waiter, stop}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if waiter not in done:
            timed_out = stop not in done
            kill_group(proc.pid)
            await waiter
        # The group may outlive its leader (a background child holding the pipes): end it.
        kill_group(proc.pid)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(pumps), 2.0)
    except BaseException:
        kill_group(proc.pid)
        raise
    finally:
        stop.cancel()
        if not pumps.done():
            pumps.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await pumps
    rc = proc.returncode if proc.returncode is not None else -9
    return ExecResult(
        rc=rc,
        stdout=out.kept.decode("utf-8", "replace"),
        stderr=err.kept.decode("utf-8", "replace"),
        timed_out=timed_out,
        truncated=out.total > output_bytes or err.total > output_bytes,
        duration_s=time.perf_counter() - t0,
    )
