"""Per-sandbox cgroup v1 memory and pids groups, used when the host lets us create them.

Why, on top of rlimits: RLIMIT_AS bounds each process, so N processes may together use N times
the memory limit; a memory cgroup bounds the sandbox as a whole (the kernel's OOM killer acts
inside it). The pids group repeats the process limit at the sandbox level. Controllers that are
missing or read-only (cgroup v2 only, an unprivileged user) are skipped, with one log line.
"""

from __future__ import annotations

import contextlib
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

    @property
    def enabled(self) -> bool:
        return bool(self.parents)

    def create(self, name: str, uid: int, *, memory_bytes: int, max_pids: int) -> list[Path]:
        """Make the groups for one sandbox; ``uid`` may then move its own processes into them."""
        made: list[Path] = []
        try:
            for ctrl, parent in self.parents.items():
                d = parent / name
                d.mkdir()
                made.append(d)
                if ctrl == "memory":
                    (d / "memory.limit_in_bytes").write_text(str(memory_bytes))
                    with contextlib.suppress(OSError):  # only with swap accounting
                        (d / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
                else:
                    (d / "pids.max").write_text(str(max_pids))
                os.chown(d / "cgroup.procs", uid, -1)
        except OSError:
            self.remove(made)
            raise
        return made

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
