"""Host-side file operations on a workspace that an untrusted process may be changing.

The host runs these as root, so a symlink planted by the agent must never lead them outside the
workspace. Every path is walked one component at a time with ``O_NOFOLLOW`` relative to an open
directory fd, which closes the check-then-open race that ``realpath`` checks leave. Reads use
``O_NOATIME`` where allowed so that the host's own reads do not look like agent access.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from rollyard.core.errors import InvalidRequest, SandboxError
from rollyard.sandbox._quota import unmount

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOATIME = getattr(os, "O_NOATIME", 0)


def split_rel(path: str) -> list[str]:
    """Validate a workspace-relative path and return its components; '.' and '' mean the root."""
    if not isinstance(path, str) or "\x00" in path:
        raise InvalidRequest(f"invalid workspace path {path!r}")
    if path.startswith("/"):
        raise InvalidRequest(f"workspace paths are relative, got absolute path {path!r}")
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise InvalidRequest(f"workspace path {path!r} climbs out of the workspace")
    return parts


def _open_dir(root: Path, parts: list[str], *, create: bool, owner: tuple[int, int] | None) -> int:
    fd = os.open(root, _DIR_FLAGS)
    try:
        for name in parts:
            try:
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                os.mkdir(name, 0o755, dir_fd=fd)
                if owner is not None:
                    os.chown(name, *owner, dir_fd=fd, follow_symlinks=False)
                nfd = os.open(name, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = nfd
    except OSError as e:
        os.close(fd)
        if e.errno in (40, 20):  # ELOOP (a symlink) or ENOTDIR
            raise SandboxError(f"path component is not a directory inside the workspace: {e}") from e
        raise
    return fd


def write_file(
    root: Path, rel: str, data: bytes, *, owner: tuple[int, int] | None, mode: int = 0o644
) -> None:
    """Create or replace ``root/rel`` without following any symlink on the way."""
    parts = split_rel(rel)
    if not parts:
        raise InvalidRequest("cannot write to the workspace root itself")
    dfd = _open_dir(root, parts[:-1], create=True, owner=owner)
    try:
        with contextlib.suppress(FileNotFoundError):
            st = os.stat(parts[-1], dir_fd=dfd, follow_symlinks=False)
            if not stat.S_ISREG(st.st_mode):  # symlink, fifo, dir: replace, never write through
                if stat.S_ISDIR(st.st_mode):
                    raise SandboxError(f"{rel!r} is a directory")
                os.unlink(parts[-1], dir_fd=dfd)
            elif st.st_nlink > 1:  # a hard link may share its inode with a file elsewhere
                os.unlink(parts[-1], dir_fd=dfd)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(parts[-1], flags, mode, dir_fd=dfd)
        os.fchmod(fd, mode)
        try:
            if owner is not None:
                os.fchown(fd, *owner)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
    finally:
        os.close(dfd)


def _open_regular(dfd: int, name: str) -> int:
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags | _NOATIME, dir_fd=dfd)
    except PermissionError:
        fd = os.open(name, flags, dir_fd=dfd)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise SandboxError(f"{name!r} is not a regular file")
    return fd


def read_file(root: Path, rel: str, *, max_bytes: int | None = None) -> bytes:
    """Read ``root/rel`` (a regular file, reached without symlinks)."""
    parts = split_rel(rel)
    if not parts:
        raise InvalidRequest("cannot read the workspace root as a file")
    try:
        dfd = _open_dir(root, parts[:-1], create=False, owner=None)
    except FileNotFoundError as e:
        raise SandboxError(f"no such file in workspace: {rel!r}") from e
    try:
        try:
            fd = _open_regular(dfd, parts[-1])
        except FileNotFoundError as e:
            raise SandboxError(f"no such file in workspace: {rel!r}") from e
        except OSError as e:
            raise SandboxError(f"cannot read {rel!r}: {e.strerror}") from e
        with os.fdopen(fd, "rb") as f:
            return f.read() if max_bytes is None else f.read(max_bytes)
    finally:
        os.close(dfd)


def _walk(dfd: int, prefix: str) -> Iterator[tuple[str, int, os.stat_result]]:
    """(relative path, parent dir fd, lstat) for every entry below ``dfd``, depth first."""
    for name in sorted(os.listdir(dfd)):
        st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        rel = f"{prefix}{name}"
        yield rel, dfd, st
        if stat.S_ISDIR(st.st_mode):
            try:
                sub = os.open(name, _DIR_FLAGS, dir_fd=dfd)
            except OSError:
                continue
            try:
                yield from _walk(sub, rel + "/")
            finally:
                os.close(sub)


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> sha256 for regular files; symlinks hash as ``link:<target>``."""
    out: dict[str, str] = {}
    top = os.open(root, _DIR_FLAGS)
    try:
        for rel, dfd, st in _walk(top, ""):
            name = rel.rsplit("/", 1)[-1]
            if stat.S_ISLNK(st.st_mode):
                target = os.readlink(name, dir_fd=dfd)
                out[rel] = hashlib.sha256(f"link:{target}".encode()).hexdigest()
            elif stat.S_ISREG(st.st_mode):
                try:
                    fd = _open_regular(dfd, name)
                except (OSError, SandboxError):
                    continue  # vanished or swapped while walking
                h = hashlib.sha256()
                with os.fdopen(fd, "rb") as f:
                    for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                        h.update(chunk)
                out[rel] = h.hexdigest()
    finally:
        os.close(top)
    return out


def copy_tree(src: Path, dest: Path, *, owner: tuple[int, int] | None) -> int:
    """Copy a directory's contents into ``dest`` (created if missing); returns files copied.

    Symlinks are copied as symlinks (never followed), sockets, fifos and devices are skipped,
    modes are kept and everything is owned by ``owner``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    count = 0
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        rel = os.path.relpath(dirpath, src)
        target_dir = dest if rel == "." else dest / rel
        for name in dirnames + filenames:
            s = os.path.join(dirpath, name)
            d = target_dir / name
            st = os.lstat(s)
            if stat.S_ISDIR(st.st_mode):
                d.mkdir(mode=stat.S_IMODE(st.st_mode) | 0o700, exist_ok=True)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(s), d)
            elif stat.S_ISREG(st.st_mode):
                shutil.copyfile(s, d, follow_symlinks=False)
                os.chmod(d, stat.S_IMODE(st.st_mode))
                count += 1
            else:
                continue
            if owner is not None:
                os.chown(d, *owner, follow_symlinks=False)
    if owner is not None:
        os.chown(dest, *owner)
    return count


def upload_tree(src: Path, root: Path, dest: str, *, owner: tuple[int, int] | None) -> int:
    """Copy a trusted host directory into ``root/dest`` file by file through ``write_file``, so a
    symlink the agent left in the workspace (``tests -> /etc``) cannot redirect the copy."""
    count = 0
    for dirpath, _dirnames, filenames in os.walk(src, followlinks=False):
        rel_dir = os.path.relpath(dirpath, src)
        prefix = "/".join(p for p in (dest, "" if rel_dir == "." else rel_dir) if p)
        if prefix:
            os.close(_open_dir(root, split_rel(prefix), create=True, owner=owner))
        for name in filenames:
            s = os.path.join(dirpath, name)
            st = os.lstat(s)
            if not stat.S_ISREG(st.st_mode):
                continue  # links and specials in an upload source are not copied
            with open(s, "rb") as f:
                data = f.read()
            rel = f"{prefix}/{name}" if prefix else name
            write_file(root, rel, data, owner=owner, mode=stat.S_IMODE(st.st_mode) & 0o755)
            count += 1
    return count


def remove_tree(path: Path) -> None:
    """Remove a directory tree (detaching a quota mount on it first), making read-only
    subdirectories writable first."""
    if not os.path.lexists(path):
        return
    unmount(path)

    def _retry(func: object, p: str, _exc: object) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(p), 0o700)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, 0o700)
                shutil.rmtree(p, ignore_errors=True)
            else:
                os.unlink(p)

    shutil.rmtree(path, onerror=_retry)
