"""What a task family is: a seeded generator of task directories plus a scripted solver.

The solver yields the tool calls (``bash``, ``read_file``, ``write_file``, ``submit``; the same
names the white-box agent offers) that solve one instance; the main job turns them into SFT
demonstrations. ``mistake_prob`` inserts wrong or wasted steps before correct ones, so
demonstrations can be imperfect on purpose while the final state still solves the task.
"""

from __future__ import annotations

import random
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from rollyard.tasks.model import Task
from rollyard.tasks.writer import TaskFiles

PASS_FRACTION_MARK = "ROLLYARD_PASS_FRACTION="


class ToolCall(BaseModel):
    """One step of a scripted solution."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    mistake: bool = False  # a deliberately wrong or wasted step


def bash(command: str, *, mistake: bool = False) -> ToolCall:
    return ToolCall(name="bash", arguments={"command": command}, mistake=mistake)


def write_file(path: str, content: str, *, mistake: bool = False) -> ToolCall:
    return ToolCall(name="write_file", arguments={"path": path, "content": content}, mistake=mistake)


def read_file(path: str, *, mistake: bool = False) -> ToolCall:
    return ToolCall(name="read_file", arguments={"path": path}, mistake=mistake)


def submit() -> ToolCall:
    return ToolCall(name="submit", arguments={})


class Step(BaseModel):
    """A correct step and the detours that may be taken just before it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    call: ToolCall
    detours: list[ToolCall] = Field(default_factory=list)


def check_mistake_prob(mistake_prob: float) -> float:
    if not 0.0 <= mistake_prob <= 1.0:
        raise ValueError(f"mistake_prob must be in [0, 1], got {mistake_prob}")
    return mistake_prob


def with_mistakes(steps: list[Step], rng: random.Random, mistake_prob: float) -> list[ToolCall]:
    """The correct calls, each preceded by one of its detours with probability ``mistake_prob``."""
    check_mistake_prob(mistake_prob)
    out: list[ToolCall] = []
    for step in steps:
        if step.detours and rng.random() < mistake_prob:
            d = rng.choice(step.detours)
            out.append(d.model_copy(update={"mistake": True}))
        out.append(step.call)
    return out


def pass_fraction_check(checks: list[tuple[str, str]]) -> str:
    """Source of a stdlib-only hidden test: each (path, expected text) is one sub-goal.

    It prints the pass fraction on a marked line (dense signal) and exits 0 only when all pass.
    """
    lines = [
        "import sys",
        "from pathlib import Path",
        f"CHECKS = {checks!r}",
        "ok = 0",
        "for path, want in CHECKS:",
        "    p = Path(path)",
        "    got = p.read_text(errors='replace').strip() if p.is_file() else None",
        "    good = got == want",
        "    ok += good",
        "    print(('PASS ' if good else 'FAIL ') + path)",
        f"print('{PASS_FRACTION_MARK}' + str(ok / len(CHECKS)))",
        "sys.exit(0 if ok == len(CHECKS) else 1)",
    ]
    return "\n".join(lines) + "\n"


class Family(Protocol):
    name: str
    description: str

    def make(self, rng: random.Random, task_id: str) -> TaskFiles:
        """One instance, fully determined by ``rng``."""
        ...

    def solve(self, task: Task, rng: random.Random, mistake_prob: float) -> list[ToolCall]:
        """The tool calls that solve ``task`` (with deliberate detours at ``mistake_prob``)."""
        ...
