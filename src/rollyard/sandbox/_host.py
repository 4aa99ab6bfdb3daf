"""What both providers share: a workspace directory on the host and safe file operations on it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from rollyard.core.errors import InvalidRequest, SandboxError
from rollyard.sandbox import _fs
from rollyard.sandbox.base import SandboxSpec

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def check_env(env: dict[str, str]) -> dict[str, str]:
    """Reject names and values the kernel or a shell would mangle."""
    for k, v in env.items():
        if not isinstance(k, str) or not _ENV_NAME.match(k):
            raise InvalidRequest(f"invalid environment variable name {k!r}")
        if not isinstance(v, str) or "\x00" in v:
            raise InvalidRequest(f"invalid value for environment variable {k}")
    return env


def check_spec(spec: SandboxSpec) -> None:
    """Fail at create time, with the offending field named, rather than at first exec."""
    if spec.base_dir is not None and not spec.base_dir.is_dir():
        raise SandboxError(f"base_dir {spec.base_dir} is not a directory")
    for kind, binds in (("ro_binds", spec.ro_binds), ("rw_binds", spec.rw_binds)):
        for host, inside in binds:
            if not host.exists():
                raise SandboxError(f"{kind}: host path {host} does not exist")
            if not str(inside).startswith("/") or ".." in Path(inside).parts:
                raise InvalidRequest(f"{kind}: sandbox path {inside} must be absolute without '..'")
    if not spec.workdir.startswith("/") or ".." in spec.workdir.split("/") or spec.workdir == "/":
        raise InvalidRequest(f"workdir {spec.workdir!r} must be an absolute path below /")
    check_env(spec.env)


class HostWorkspace:
    """File operations on ``workspace`` (a host directory) that never leave it."""

    id: str
    spec: SandboxSpec
    workspace: Path  # host path; lets hygiene copy a final workspace into a fresh sandbox
    _owner: tuple[int, int] | None
    _closed: bool

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxError(f"sandbox {self.id} is closed")

    async def write(self, path: str, data: bytes | str) -> None:
        self._check_open()
        raw = data.encode() if isinstance(data, str) else bytes(data)
        await asyncio.to_thread(_fs.write_file, self.workspace, path, raw, owner=self._owner)

    async def read(self, path: str) -> bytes:
        self._check_open()
        return await asyncio.to_thread(_fs.read_file, self.workspace, path)

    async def upload(self, src: Path, dest: str = ".") -> None:
        self._check_open()
        if not Path(src).is_dir():
            raise SandboxError(f"upload source {src} is not a directory")
        base = "/".join(_fs.split_rel(dest))
        await asyncio.to_thread(_fs.upload_tree, Path(src), self.workspace, base, owner=self._owner)

    async def snapshot(self) -> dict[str, str]:
        self._check_open()
        return await asyncio.to_thread(_fs.snapshot, self.workspace)
