"""Run an unmodified CLI agent inside a sandbox, pointed at its program's endpoint.

The gateway's unix socket directory is bound into the sandbox; a shipped forwarder listens on
the sandbox's own loopback and relays to that socket, so the agent's only reachable address is
``http://127.0.0.1:PORT``. The host's Python is bound read-only so Python agents and the
forwarder run. After the run, the runner's files and the profile's declared artefacts are
removed from the workspace (hygiene) before it is evaluated.
"""

from __future__ import annotations

import logging
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from rollyard.core.errors import ConfigError, SandboxError
from rollyard.core.net import free_port
from rollyard.sandbox.base import Sandbox, SandboxSpec
from rollyard.sandbox.host_python import SYSTEM_PATH, host_python, searchable

from ..install import require
from . import forwarder
from .profile import AGENT_DIR, OutputSource, RunnerProfile, TaskInput, render

log = logging.getLogger(__name__)

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
FORWARDER = Path(forwarder.__file__).resolve()
_TAIL = 4000


class RunResult(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rc: int
    timed_out: bool
    output: str | None  # the agent's final output, per the profile
    stdout: str
    stderr: str
    duration_s: float


class BlackBoxRunner:
    """One profile, one gateway socket; ``spec`` builds the sandbox, ``run`` runs the agent in it."""

    def __init__(self, profile: RunnerProfile, socket_path: Path, *, isolated: bool = True) -> None:
        self.profile = profile
        self.socket_path = Path(socket_path)
        self.isolated = isolated

    def through(self, socket_path: Path) -> BlackBoxRunner:
        """The same runner on another gateway socket (a sharded gateway's, in the same directory:
        the sandbox binds that directory, so any shard's socket is reachable the same way)."""
        if Path(socket_path) == self.socket_path:
            return self
        return BlackBoxRunner(self.profile, socket_path, isolated=self.isolated)

    def spec(self, base: SandboxSpec | None = None) -> SandboxSpec:
        """``base`` plus the socket dir (read-write), the forwarder, examples, Python and the
        profile's CLI (read-only), under ``base``'s limits with the profile's own on top."""
        base = base or SandboxSpec()
        base = base.model_copy(update={"limits": self.profile.sandbox_limits(base.limits)})
        py = host_python(isolated=self.isolated)
        binds, env = list(py.ro_binds), {**py.env, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        cli = self.profile.cli
        if cli is not None:
            cli = require(cli)
            if self.isolated and not searchable(cli.dir):
                raise ConfigError(
                    f"{cli.dir} is not reachable by the sandbox's user (a parent directory is "
                    "private); set ROLLYARD_CACHE to a directory others can traverse and reinstall"
                )
            binds.append((cli.dir, cli.dir))
            if cli.source == "pypi":  # its packages first, this environment's after
                env["PYTHONPATH"] = ":".join(filter(None, [str(cli.site), env.get("PYTHONPATH")]))
            path = ":".join([*(str(d) for d in cli.bin_dirs), env.get("PATH", SYSTEM_PATH)])
            env["PATH"] = path
        if not self.isolated:
            return base.model_copy(update={"env": {**base.env, **env}})
        ro = [*base.ro_binds, *binds, (FORWARDER.parent, FORWARDER.parent), (EXAMPLES_DIR, EXAMPLES_DIR)]
        rw = [*base.rw_binds, (self.socket_path.parent, self.socket_path.parent)]
        return base.model_copy(update={"env": {**base.env, **env}, "ro_binds": ro, "rw_binds": rw})

    def _script(self, command: list[str], port: int) -> str:
        p = self.profile
        stdin = f" < {AGENT_DIR}/task.txt" if p.task_input is TaskInput.STDIN else " < /dev/null"
        fwd = shlex.join(["python3", str(FORWARDER), "--port", str(port), "--socket", str(self.socket_path)])
        return "\n".join(
            [
                f"{fwd} --ready {AGENT_DIR}/fwd.ready > {AGENT_DIR}/fwd.log 2>&1 &",
                "FWD=$!",
                f"for i in $(seq 1 200); do [ -s {AGENT_DIR}/fwd.ready ] && break; sleep 0.05; done",
                f"[ -s {AGENT_DIR}/fwd.ready ] || {{ echo 'forwarder did not start' >&2; exit 125; }}",
                shlex.join(command) + stdin,
                "rc=$?",
                "kill $FWD 2>/dev/null",
                "exit $rc",
            ]
        )

    async def run(self, sandbox: Sandbox, *, task: str, api_key: str, model: str) -> RunResult:
        """Run the agent on ``task`` with the program's key; never raises for agent failures."""
        if not self.socket_path.exists():
            raise ConfigError(f"gateway socket {self.socket_path} does not exist")
        p = self.profile
        port = free_port()
        values = {
            "base_url": f"http://127.0.0.1:{port}/v1",
            "origin": f"http://127.0.0.1:{port}",
            "api_key": api_key,
            "model": model,
            "task": task,
            "task_file": f"{AGENT_DIR}/task.txt",
            "agent_dir": AGENT_DIR,
            "examples": str(EXAMPLES_DIR),
            "install": str(p.cli.site) if p.cli is not None else "",
        }
        await sandbox.write(f"{AGENT_DIR}/task.txt", task)
        for rel, template in p.files.items():
            await sandbox.write(rel, render(template, values))
        env = {k: render(v, values) for k, v in p.env.items()}
        command = [render(c, values) for c in p.command]
        try:
            res = await sandbox.exec(self._script(command, port), timeout=p.timeout_s, env=env)
            output: str | None = res.stdout.strip()
            if p.output is OutputSource.FILE:
                try:
                    output = (await sandbox.read(p.output_file or "")).decode(errors="replace").strip()
                except (SandboxError, OSError, FileNotFoundError):
                    output = None
        finally:
            await self._clean(sandbox)
        log.info("blackbox profile=%s rc=%s timed_out=%s", p.name, res.rc, res.timed_out)
        return RunResult(
            rc=res.rc,
            timed_out=res.timed_out,
            output=output,
            stdout=res.stdout[-_TAIL:],
            stderr=res.stderr[-_TAIL:],
            duration_s=res.duration_s,
        )

    async def _clean(self, sandbox: Sandbox) -> None:
        """Remove the runner's own files and the profile's declared artefacts (validated globs)."""
        globs = [AGENT_DIR, *self.profile.files, *self.profile.hygiene]
        res = await sandbox.exec(
            "shopt -s globstar nullglob dotglob; rm -rf -- " + " ".join(globs), timeout=30
        )
        if res.rc != 0:
            log.warning("blackbox hygiene failed sandbox=%s stderr=%s", sandbox.id, res.stderr[-200:])
