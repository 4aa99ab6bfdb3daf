"""A total disk quota per sandbox: its host directory is a size-limited tmpfs.

Why: ``RLIMIT_FSIZE`` bounds one file, not how many; a command writing many files could fill
the host disk. A tmpfs mounted on the sandbox's directory (workspace, /tmp and home are inside
it) refuses writes past ``size`` with ENOSPC, costs one ``mount(2)`` per sandbox (no fork),
and vanishes with its content on unmount. Its pages are memory, charged to the writer's
memory cgroup, so the sandbox's memory limit bounds them too. Needs CAP_SYS_ADMIN (the bwrap
provider as root); elsewhere the sandbox runs without a total quota (logged once).
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

_MS_NOSUID, _MS_NODEV = 2, 4
_MNT_DETACH = 2
_libc = ctypes.CDLL(None, use_errno=True)
_warned = False


def mount_quota(path: Path, size_mb: int, mode: int = 0o711) -> bool:
    """Mount a ``size_mb`` tmpfs on the (empty) directory ``path``; False when not allowed."""
    global _warned
    data = f"size={size_mb}m,mode={mode:o}".encode()
    if _libc.mount(b"tmpfs", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, data) == 0:
        return True
    err = ctypes.get_errno()
    if not _warned:
        log.warning("no per-sandbox disk quota: mounting a tmpfs failed (%s)", os.strerror(err))
        _warned = True
    return False


def unmount(path: Path) -> None:
    """Detach a quota mount (its content is freed with it); nothing if ``path`` is not one."""
    if os.path.ismount(path):
        _libc.umount2(os.fsencode(path), _MNT_DETACH)
