"""Per-sandbox cgroup v1 memory and pids groups, used when the host lets us create them.

Why, on top of rlimits: RLIMIT_AS bounds each process, so N processes may together use N times
the memory limit; a memory cgroup bounds the sandbox as a whole (the kernel's OOM killer acts
inside it). The pids group repeats the process limit at the sandbox level. Controllers that are
missing or read-only (cgroup v2 only, an unprivileged user) are skipped, with one log line.

The groups of every provider on the host share one parent, so whoever made a group holds an
exclusive ``flock`` on its directory for as long as the sandbox lives: the kernel drops it when
that process dies, however it dies. A collector removes only groups it can lock itself (``claim``),
which proves the owner gone; a provider with another lock directory, which knows nothing of a
sandbox, removed its groups while they were live and killed what ran in them.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import time
from pathlib import Path

log = logging.getLogger(__name__)
CGROUP_ROOT = Path("/sys/fs/cgroup")


class Cgroups:
    def __init__(self, base: str = "rollyard", root: Path = CGROUP_ROOT) -> None:
        self.parents: dict[str, Path] = {}
        for ctrl in ("memory", "pids"):
            parent = root / ctrl / base
            try:
                parent.mkdir(exist_ok=True)
                if not os.access(parent, os.W_OK):
                    raise PermissionError(parent)
            except OSError as e:
                log.info("cgroup controller %s unavailable (%s); relying on rlimits", ctrl, e)
                continue
            self.parents[ctrl] = parent
        self._held: dict[str, list[int]] = {}  # sandbox name -> the locked fds of its groups

    @property
    def enabled(self) -> bool:
        return bool(self.parents)

    def create(self, name: str, uid: int, *, memory_bytes: int, max_pids: int) -> list[Path]:
        """Make the groups for one sandbox; ``uid`` may then move its own processes into them."""
        made: list[Path] = []
        held = self._held.setdefault(name, [])
        try:
            for ctrl, parent in self.parents.items():
                d = parent / name
                d.mkdir()
                made.append(d)
                fd = hold(d)
                if fd is None:  # another process locked it first: not ours to configure
                    raise OSError(f"cgroup {d} was taken by another process")
                held.append(fd)
                if ctrl == "memory":
                    (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    with contextlib.suppress(OSError):  # only with swap accounting
                        (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                else:
                    (d / "pids.max").write_text(str(max_pids))
                os.chown(d / "cgroup.procs", uid, -1)
        except OSError:
            self.remove(made)
            self.release(name)
            raise
        return made

    def release(self, name: str) -> None:
        """Let go of a sandbox's groups (after ``remove``)."""
        for fd in self._held.pop(name, []):
            os.close(fd)

    @staticmethod
    def claim(dirs: list[Path]) -> list[int] | None:
        """Lock every group of a sandbox this process did not make, proving its owner gone; None
        (and nothing held) while any is held by a live owner anywhere on the host."""
        fds: list[int] = []
        for d in dirs:
            try:
                fd = hold(d)
            except FileNotFoundError:
                continue
            if fd is None:
                for f in fds:
                    os.close(f)
                return None
            fds.append(fd)
        return fds

    @staticmethod
    def procs_files(dirs: list[Path]) -> list[str]:
        """The files a process writes to join ``dirs`` (see ``_proc.confine``)."""
        return [str(d / "cgroup.procs") for d in dirs]

    @staticmethod
    def members(dirs: list[Path]) -> int:
        n = 0
        for d in dirs:
            with contextlib.suppress(OSError):
                n += len((d / "cgroup.procs").read_text().split())
        return n

    @staticmethod
    def remove(dirs: list[Path], wait_s: float = 2.0) -> int:
        """Kill what is left inside, then remove the groups; returns groups that could not go."""
        deadline = time.monotonic() + wait_s
        left = list(dirs)
        while left:
            for d in list(left):
                try:
                    pids = (d / "cgroup.procs").read_text().split()
                except FileNotFoundError:
                    left.remove(d)
                    continue
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError, ValueError):
                        os.kill(int(pid), signal.SIGKILL)
                with contextlib.suppress(OSError):
                    d.rmdir()
                    left.remove(d)
            if not left or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        return len(left)


def hold(d: Path) -> int | None:
    """An fd of directory ``d`` holding an exclusive flock on it, or None if another holds it."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd
