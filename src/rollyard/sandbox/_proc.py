"""Run one host process with a wall-clock deadline and capped output, killing its whole group.

Shared by the providers: each builds an argv (bwrap's, or a plain shell's) and hands it here.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from rollyard.core.errors import SandboxError
from rollyard.sandbox._pidns import PidNamespace
from rollyard.sandbox.base import ExecResult

log = logging.getLogger(__name__)
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


def confine(rlimits: Sequence[tuple[int, int]], cgroup_procs: Sequence[str]) -> Callable[[], None]:
    """A ``preexec_fn`` that joins cgroups and lowers rlimits in the forked child, after its uid
    switch and before exec: everything the exec'd program forks inherits both, with no window to
    escape, and no extra ``sh``/``prlimit`` process is started per command. It keeps to system
    calls on values prepared here (no logging, imports or locks of its own), which is what keeps a
    ``preexec_fn`` safe after a fork from a threaded parent. A failure aborts the exec (Popen
    raises) rather than running the command unconfined."""
    procs = tuple(os.fsencode(p) for p in cgroup_procs)
    limits = tuple((res, (value, value)) for res, value in rlimits)

    def setup() -> None:
        for path in procs:
            fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
            try:
                os.write(fd, b"0")  # "0": the writing process itself
            finally:
                os.close(fd)
        for res, pair in limits:
            resource.setrlimit(res, pair)

    return setup


# dash's ulimit flag and unit per rlimit (bash's differ: -u for processes, other block sizes).
_DASH_ULIMIT = {
    resource.RLIMIT_NPROC: ("-p", 1),
    resource.RLIMIT_AS: ("-v", 1024),
    resource.RLIMIT_CPU: ("-t", 1),
    resource.RLIMIT_FSIZE: ("-f", 512),
    resource.RLIMIT_CORE: ("-c", 512),
}


def dash_confine(dash: str, rlimits: Sequence[tuple[int, int]], cgroup_procs: Sequence[str]) -> list[str]:
    """The argv prefix that does what ``confine`` does from one ``dash`` process, which then execs
    the rest in place; unlike a ``preexec_fn`` it lets Popen use vfork (see ``bwrap``). A failing
    step stops the chain, so nothing runs unconfined."""
    steps = [f"echo $$ > {shlex.quote(p)}" for p in cgroup_procs]
    for res, value in rlimits:
        flag, unit = _DASH_ULIMIT[res]
        steps.append(f"ulimit {flag} {value // unit}")  # rounds down: never looser than asked
    return [dash, "-c", " && ".join([*steps, 'exec "$@"']), "dash"]


def kill_group(pid: int) -> None:
    """SIGKILL a process group; bwrap's --die-with-parent then takes its pid namespace down."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


async def _end(
    proc: subprocess.Popen[bytes], exited: asyncio.Future[None], pidns: PidNamespace | None
) -> None:
    """Kill a run: its pid namespace first, so that bwrap reaps the namespace's pid 1 (see
    ``_pidns``), and bwrap's group only if it is still there after that."""
    if pidns is not None and await pidns.kill(exited):
        await asyncio.wait({exited}, timeout=2.0)
    kill_group(proc.pid)
    await exited


def _reap(proc: subprocess.Popen[bytes]) -> int:
    """Wait for ``proc`` so that it never stays a zombie of ours; one that will not die even
    after SIGKILL is waited for by a thread rather than left unreaped."""
    for _ in range(2):
        try:
            return proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
    log.error("pid %d did not die after SIGKILL; a thread waits for it", proc.pid)
    threading.Thread(target=proc.wait, name=f"reap-{proc.pid}", daemon=True).start()
    return -9


async def run_capped(
    argv: list[str],
    *,
    timeout: float,
    output_bytes: int,
    env: dict[str, str] | None = None,
    cwd: str | None = None,
    user: int | None = None,
    pass_fds: tuple[int, ...] = (),
    preexec: Callable[[], None] | None = None,
    pidns: PidNamespace | None = None,
) -> ExecResult:
    """Run ``argv``; on timeout or runaway output kill it (``pidns``: the pid namespace of the
    bwrap it is, first) and its process group; a killed run's rc is -9. Never raises for the
    command's own failure, only when it cannot be started. ``preexec`` (see ``confine``) runs in
    the child just before exec.

    Exit is watched through a pidfd and the pipes through the loop's readers, not through
    asyncio's subprocess transport: that one (3.11) only reports exit once both pipes reach EOF,
    so a process killed while a grandchild still holds its stdout would be waited on forever.
    """
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=cwd,
            start_new_session=True,
            user=user,
            group=user,
            extra_groups=[] if user is not None else None,
            pass_fds=pass_fds,
            preexec_fn=preexec,
        )
    except (OSError, subprocess.SubprocessError) as e:
        raise SandboxError(f"cannot start {argv[0]!r}: {e}") from e
    assert proc.stdout is not None and proc.stderr is not None
    if pidns is not None:
        pidns.attach(proc.pid)
    pidfd = os.pidfd_open(proc.pid)
    caps = {proc.stdout.fileno(): _Capture(output_bytes), proc.stderr.fileno(): _Capture(output_bytes)}
    open_fds = set(caps)
    exited: asyncio.Future[None] = loop.create_future()
    drained: asyncio.Future[None] = loop.create_future()
    runaway: asyncio.Future[None] = loop.create_future()

    def on_output(fd: int) -> None:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            loop.remove_reader(fd)
            open_fds.discard(fd)
            if not open_fds and not drained.done():
                drained.set_result(None)
            return
        cap = caps[fd]
        cap.add(chunk)  # keeps reading (and discarding) past the cap, so writers never block
        if cap.total > cap.cap * RUNAWAY_FACTOR and not runaway.done():
            runaway.set_result(None)

    def on_exit() -> None:
        loop.remove_reader(pidfd)
        if not exited.done():
            exited.set_result(None)

    for fd in caps:
        os.set_blocking(fd, False)
        loop.add_reader(fd, on_output, fd)
    loop.add_reader(pidfd, on_exit)
    timed_out = killed = False
    try:
        done, _ = await asyncio.wait({exited, runaway}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if exited not in done:
            timed_out = runaway not in done
            killed = True
            await _end(proc, exited, pidns)
        # The group may outlive its leader (a background child holding the pipes): end it.
        kill_group(proc.pid)
        if open_fds:
            await asyncio.wait({drained}, timeout=2.0)
    except BaseException:
        if pidns is None or not pidns.kill_now():  # else bwrap exits once it has reaped its pid 1
            kill_group(proc.pid)
        raise
    finally:
        for fd in list(open_fds):
            loop.remove_reader(fd)
        loop.remove_reader(pidfd)
        os.close(pidfd)
        proc.stdout.close()
        proc.stderr.close()
        rc = _reap(proc)
    out, err = caps.values()
    return ExecResult(
        rc=-9 if killed else rc,
        stdout=out.kept.decode("utf-8", "replace"),
        stderr=err.kept.decode("utf-8", "replace"),
        timed_out=timed_out,
        truncated=out.total > output_bytes or err.total > output_bytes,
        duration_s=time.perf_counter() - t0,
    )
