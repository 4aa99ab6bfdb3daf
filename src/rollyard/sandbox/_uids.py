"""A dedicated, unprivileged host uid per live sandbox.

Why: the kernel does not enforce RLIMIT_NPROC for host root, and a user namespace created by root
maps its users back to root. Running each sandbox's bwrap as its own unused uid makes the process
limit real (and per sandbox), keeps host files owned by root out of reach, and turns "did the
sandbox leak a process?" into "does any process of this uid remain?". Uids are leased with an
``flock`` on a lock file, so several rollyard processes on one host never share one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import random
from pathlib import Path

from rollyard.core.errors import SandboxError


def try_lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on ``path`` (created if missing), or None if another
    open file holds it. Checks that the path still names the locked inode, since the holder
    unlinks the file when it lets go."""
    fd = os.open(path, os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise BlockingIOError(path)
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    return fd


def unlock(path: Path, fd: int) -> None:
    """Remove the lock file, then let go of it (in that order, see ``try_lock``)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    os.close(fd)


class UidLease:
    def __init__(self, uid: int, fd: int, path: Path) -> None:
        self.uid = uid
        self._fd = fd
        self._path = path

    def release(self) -> None:
        if self._fd >= 0:
            unlock(self._path, self._fd)
            self._fd = -1


class UidAllocator:
    def __init__(self, lock_dir: Path, first: int = 1_500_000, count: int = 100_000) -> None:
        if first < 1000 or count < 1 or first + count > 2**32 - 2:
            raise SandboxError(f"bad uid range {first}+{count}")
        self.lock_dir = lock_dir
        self.first, self.count = first, count
        lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._next = random.randrange(count)
        # Processes of a crashed run would still hold their uid: skip those (one scan, here).
        self._busy = set(processes_in_range(first, count).values())

    def lease(self) -> UidLease:
        for _ in range(self.count):
            uid = self.first + self._next
            self._next = (self._next + 1) % self.count
            if uid in self._busy:
                continue
            path = self.lock_dir / f"uid-{uid}.lock"
            fd = try_lock(path)
            if fd is not None:
                return UidLease(uid, fd, path)
        raise SandboxError("no free sandbox uid left in the configured range")


def _live_uid(pid: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            head = f.read(1024)
    except OSError:
        return None
    if b"State:\tZ" in head:
        return None
    i = head.find(b"Uid:\t")
    return int(head[i + 5 : head.index(b"\t", i + 5)]) if i >= 0 else None


def processes_in_range(first: int, count: int) -> dict[int, int]:
    """pid -> real uid for every live process whose uid lies in [first, first + count)."""
    out = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            uid = _live_uid(entry.name)
            if uid is not None and first <= uid < first + count:
                out[int(entry.name)] = uid
    return out


def processes_of(uid: int) -> list[int]:
    """Live (non-zombie) pids whose real uid is ``uid``, host view. Reads ``status``, because
    /proc/PID of a non-dumpable process is owned by root whatever its uid. Zombies are skipped:
    they hold nothing (and bwrap reaps its namespace's pid 1, see ``_pidns``)."""
    want = f"Uid:\t{uid}\t".encode()
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/status", "rb") as f:
                head = f.read(1024)
        except OSError:
            continue
        if want in head and b"State:\tZ" not in head:
            pids.append(int(entry.name))
    return pids
