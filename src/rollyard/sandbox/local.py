"""The unsafe provider: commands run directly on the host, in a workspace directory.

No isolation at all (network, host files, other workspaces are all reachable); it exists as the
benchmark baseline and for hosts without bubblewrap, and must be asked for by name.
"""

from __future__ import annotations

import asyncio
import logging
import tempfile
from pathlib import Path

from rollyard.core.errors import ConfigError, SandboxError
from rollyard.core.ids import new_id
from rollyard.sandbox import _fs
from rollyard.sandbox._host import HostWorkspace, check_env, check_spec
from rollyard.sandbox._proc import run_capped
from rollyard.sandbox.base import ExecResult, SandboxSpec

log = logging.getLogger(__name__)
PATH = "/usr/local/bin:/usr/bin:/bin"


class LocalSandbox(HostWorkspace):
    def __init__(self, spec: SandboxSpec, sid: str, root: Path) -> None:
        self.id = sid
        self.spec = spec
        self.dir = root / sid
        self.workspace = self.dir / "ws"
        self._owner = None
        self._closed = False
        self.leaked = 0

    async def exec(
        self, cmd: str | list[str], *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        self._check_open()
        command = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        if not command:
            raise SandboxError("empty command")
        lim = self.spec.limits
        limit = lim.wall_seconds if timeout is None else timeout
        if limit <= 0:
            raise SandboxError(f"timeout must be positive, got {timeout}")
        full_env = {"PATH": PATH, "HOME": str(self.workspace), "LANG": "C.UTF-8"}
        full_env.update(self.spec.env)
        full_env.update(check_env(env or {}))
        prlimit = [
            "prlimit",
            f"--as={lim.memory_mb * 1024 * 1024}",
            f"--cpu={lim.cpu_seconds}",
            f"--fsize={lim.file_size_mb * 1024 * 1024}",
            "--",
        ]
        return await run_capped(
            prlimit + command,
            timeout=limit,
            output_bytes=lim.output_bytes,
            env=full_env,
            cwd=str(self.workspace),
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(_fs.remove_tree, self.dir)
        self.leaked = int(self.dir.exists())


class LocalProvider:
    """Opt-in only: ``LocalProvider(unsafe=True)``; warns when constructed."""

    name = "local"

    def __init__(self, root: Path | None = None, *, unsafe: bool = False) -> None:
        if not unsafe:
            raise ConfigError("the local sandbox provider has no isolation; pass unsafe=True to use it")
        self.root = Path(root) if root is not None else Path(tempfile.gettempdir()) / "rollyard-local"
        self.root.mkdir(parents=True, exist_ok=True)
        log.warning("provider=local: sandboxes run unisolated on the host (no network or file limits)")

    async def create(self, spec: SandboxSpec) -> LocalSandbox:
        check_spec(spec)
        if spec.ro_binds or spec.rw_binds:
            raise SandboxError("the local provider cannot bind paths; use the bwrap provider")
        sb = LocalSandbox(spec, new_id("loc"), self.root)

        def _prepare() -> None:
            sb.workspace.mkdir(parents=True)
            if spec.base_dir is not None:
                _fs.copy_tree(spec.base_dir, sb.workspace, owner=None)

        try:
            await asyncio.to_thread(_prepare)
        except BaseException:
            await sb.close()
            raise
        log.debug("sandbox=%s provider=local created", sb.id)
        return sb
