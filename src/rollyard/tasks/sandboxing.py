"""Put a task into sandboxes: the agent's (workspace, setup, hygiene; never tests) and the
evaluator's (a final workspace plus the hidden tests, in a fresh sandbox).
"""

from __future__ import annotations

import logging
import shlex

from rollyard.core.errors import TaskError
from rollyard.sandbox.base import Sandbox, SandboxProvider, SandboxSpec
from rollyard.sandbox.host_python import host_python
from rollyard.tasks.model import SOLUTION_SCRIPT, SolutionKind, Task

log = logging.getLogger(__name__)

SETUP_DIR = ".rollyard_setup"
SOLUTION_STAGING = ".rollyard_solution"


def isolated(provider: SandboxProvider) -> bool:
    """Whether the provider's sandboxes have their own filesystem view (all but ``local``)."""
    return getattr(provider, "name", "") != "local"


def sandbox_spec(
    task: Task, provider: SandboxProvider, *, variant: str | None = None, with_workspace: bool = True
) -> SandboxSpec:
    """The sandbox a task needs: its workspace, the host's Python read-only, variant env vars."""
    py = host_python(isolated=isolated(provider))
    env = dict(py.env)
    if variant is not None:
        match = [v for v in task.spec.variants if v.name == variant]
        if not match:
            raise TaskError(f"task {task.id} has no variant {variant!r}")
        env.update(match[0].env)
    return SandboxSpec(
        base_dir=task.workspace_dir if with_workspace else None,
        network=task.spec.network,
        env=env,
        ro_binds=py.ro_binds,
        label=task.id,
    )


async def _run(sb: Sandbox, cmd: str, timeout: float, what: str, task: Task) -> None:
    res = await sb.exec(cmd, timeout=timeout)
    if res.timed_out:
        raise TaskError(f"task {task.id}: {what} ran past its {timeout:g} s timeout")
    if res.rc != 0:
        tail = (res.stderr or res.stdout)[-500:].strip()
        raise TaskError(f"task {task.id}: {what} failed with exit status {res.rc}: {tail}")


async def remove_artefacts(sb: Sandbox, globs: list[str], timeout: float = 30.0) -> None:
    """Delete declared artefacts (validated globs: no shell metacharacters) from the workspace."""
    if not globs:
        return
    res = await sb.exec("shopt -s globstar nullglob dotglob; rm -rf -- " + " ".join(globs), timeout=timeout)
    if res.rc != 0:
        log.warning("artefact removal failed sandbox=%s rc=%s stderr=%s", sb.id, res.rc, res.stderr[-200:])


async def prepare(
    task: Task, provider: SandboxProvider, *, variant: str | None = None, spec: SandboxSpec | None = None
) -> Sandbox:
    """The agent's sandbox: workspace copied in, setup run, its artefacts removed; no tests.
    ``spec``: the task's sandbox with what the agent adds (a black-box agent's binds)."""
    sb = await provider.create(spec or sandbox_spec(task, provider, variant=variant))
    try:
        await set_up(task, sb)
    except BaseException:
        await sb.close()
        raise
    return sb


async def set_up(task: Task, sb: Sandbox) -> None:
    """Run the task's setup script (if any) in a fresh workspace, then remove its artefacts."""
    script = task.setup_script
    if script is not None:
        await sb.write(f"{SETUP_DIR}/{script.name}", script.read_bytes())
        cmd = f"bash {shlex.quote(f'{SETUP_DIR}/{script.name}')}"
        await _run(sb, cmd, task.spec.timeouts.setup_s, "setup script", task)
    await remove_artefacts(sb, [SETUP_DIR, *task.spec.hygiene_artefacts])


async def apply_solution(task: Task, sb: Sandbox) -> None:
    """Apply the golden solution to a prepared workspace (overlay copy or solve.sh)."""
    if task.spec.solution is SolutionKind.OVERLAY:
        await sb.upload(task.solution_dir, ".")
        return
    await sb.upload(task.solution_dir, SOLUTION_STAGING)
    cmd = f"bash {SOLUTION_STAGING}/{SOLUTION_SCRIPT}"
    try:
        await _run(sb, cmd, task.spec.timeouts.setup_s, "golden solution script", task)
    finally:
        await remove_artefacts(sb, [SOLUTION_STAGING])
