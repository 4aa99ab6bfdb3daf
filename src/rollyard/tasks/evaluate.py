"""Score a final workspace against a task's hidden tests, in a fresh sandbox.

Shared by validation and the rollout orchestrator. The hygiene rule lives here: the tests are
added only to a new sandbox that holds a copy of the final workspace, never to the agent's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from pathlib import Path

from rollyard.core.clock import Clock, SystemClock
from rollyard.core.errors import SandboxError, TaskError
from rollyard.core.trajectory import Outcome
from rollyard.sandbox.base import ExecResult, Sandbox, SandboxProvider
from rollyard.tasks.families.base import PASS_FRACTION_MARK
from rollyard.tasks.model import Task
from rollyard.tasks.sandboxing import sandbox_spec

FinalState = Path | Mapping[str, bytes] | Sandbox

_MARK = re.compile(re.escape(PASS_FRACTION_MARK) + r"([0-9.eE+-]+)")
_PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|error|errors)\b")
_TAIL = 2000


def pass_fraction(stdout: str) -> float | None:
    """The fraction of sub-goals met: the last marked line, else a pytest summary, else None."""
    marks = _MARK.findall(stdout)
    if marks:
        try:
            value = float(marks[-1])
        except ValueError:
            return None
        return min(max(value, 0.0), 1.0)
    counts = {"passed": 0, "failed": 0}
    found = False
    for n, word in _PYTEST_COUNTS.findall(stdout):
        found = True
        counts["passed" if word == "passed" else "failed"] += int(n)
    total = counts["passed"] + counts["failed"]
    return counts["passed"] / total if found and total else None


def outcome_from(res: ExecResult, duration_s: float) -> Outcome:
    """Map the test command's result to an Outcome: rc 0 passes, a timeout fails as 'timeout'."""
    details = {"rc": res.rc, "stdout": res.stdout[-_TAIL:], "stderr": res.stderr[-_TAIL:]}
    if res.timed_out:
        return Outcome(
            status="timeout", passed=False, pass_fraction=0.0, duration_s=duration_s, details=details
        )
    passed = res.rc == 0
    frac = pass_fraction(res.stdout)
    if frac is None:
        frac = 1.0 if passed else 0.0
    return Outcome(
        status="success" if passed else "failure",
        passed=passed,
        pass_fraction=frac,
        duration_s=duration_s,
        details=details,
    )


async def _files_of(sb: Sandbox) -> dict[str, bytes]:
    listing = await sb.snapshot()
    return {rel: await sb.read(rel) for rel in sorted(listing)}


async def evaluate(
    task: Task, final: FinalState, provider: SandboxProvider, *, clock: Clock | None = None
) -> Outcome:
    """Run the hidden tests on a copy of ``final`` (a directory, a path->bytes map, or a live
    sandbox whose files are copied out) in a fresh sandbox, and return the outcome."""
    clock = clock or SystemClock()
    t0 = clock.now()
    files: Mapping[str, bytes] | None = None
    spec = sandbox_spec(task, provider, with_workspace=False)
    if isinstance(final, Path):
        if not final.is_dir():
            raise TaskError(f"final workspace {final} is not a directory")
        spec = spec.model_copy(update={"base_dir": final})
    elif isinstance(final, Mapping):
        files = final
    elif isinstance(final, Sandbox):
        files = await _files_of(final)
    else:
        raise TaskError(f"cannot evaluate a final state of type {type(final).__name__}")
    sb = await provider.create(spec)
    try:
        for rel, data in (files or {}).items():
            await sb.write(rel, data)
        dest = task.spec.tests_dest
        await sb.exec(f"rm -rf -- {shlex.quote(dest)}", timeout=30)  # the agent may have planted one
        await sb.upload(task.tests_dir, dest)
        res = await sb.exec(task.spec.test_command, timeout=task.spec.timeouts.test_s)
    except SandboxError as e:
        return Outcome(status="error", passed=False, pass_fraction=0.0, details={"error": e.message})
    finally:
        await sb.close()
    return outcome_from(res, clock.now() - t0)
