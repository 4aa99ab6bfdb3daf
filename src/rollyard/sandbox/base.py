"""The sandbox protocol: an isolated workspace that runs model-written commands.

Providers (``bwrap`` by default, ``local`` only on explicit opt-in) implement ``Sandbox``;
everything above this package (tasks, agents, rollout) speaks only this protocol.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field


class Limits(BaseModel):
    """Resource limits applied to every command run in a sandbox."""

    model_config = ConfigDict(extra="forbid")

    cpu_seconds: int = Field(default=30, ge=1)
    memory_mb: int = Field(default=1024, ge=16)
    max_processes: int = Field(default=128, ge=1)
    wall_seconds: float = Field(default=60.0, gt=0)
    output_bytes: int = Field(default=64 * 1024, ge=256)  # per stream, per command
    file_size_mb: int = Field(default=256, ge=1)
    # All files of a sandbox together (workspace, /tmp, home): a size-limited tmpfs where the
    # host allows mounts (bwrap provider as root); its pages count against memory_mb's cgroup.
    disk_mb: int = Field(default=1024, ge=1)
    seccomp: bool = True  # deny ptrace, mount, keyctl, bpf, perf_event_open, ... (bwrap provider)


class SandboxSpec(BaseModel):
    """What a sandbox is made from."""

    model_config = ConfigDict(extra="forbid")

    base_dir: Path | None = None  # copied (or overlaid) into the workspace; None = empty
    network: bool = False  # no network at all unless a task needs it
    env: dict[str, str] = Field(default_factory=dict)
    limits: Limits = Field(default_factory=Limits)
    ro_binds: list[tuple[Path, Path]] = Field(default_factory=list)  # (host, inside), read-only
    rw_binds: list[tuple[Path, Path]] = Field(default_factory=list)  # e.g. a gateway unix socket dir
    workdir: str = "/workspace"
    label: str = ""  # task id / program id, for logs and metrics


class ExecResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rc: int
    stdout: str
    stderr: str
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0


@runtime_checkable
class Sandbox(Protocol):
    id: str
    spec: SandboxSpec

    async def exec(
        self, cmd: str | list[str], *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        """Run a command (a string goes through ``bash -lc``) inside the sandbox."""
        ...

    async def write(self, path: str, data: bytes | str) -> None:
        """Write a file at ``path`` relative to the workspace (never outside it)."""
        ...

    async def read(self, path: str) -> bytes: ...

    async def upload(self, src: Path, dest: str = ".") -> None:
        """Copy a host directory's contents into the workspace."""
        ...

    async def snapshot(self) -> dict[str, str]:
        """Workspace listing: relative path -> sha256 of its content."""
        ...

    async def close(self) -> None:
        """Kill every process and remove every file and mount of this sandbox. Idempotent."""
        ...


class SandboxProvider(Protocol):
    name: str

    async def create(self, spec: SandboxSpec) -> Sandbox: ...
