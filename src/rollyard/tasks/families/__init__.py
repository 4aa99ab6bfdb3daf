"""The shipped task families, by name, and the two things callers do with them."""

from __future__ import annotations

import random
from pathlib import Path

from rollyard.core.errors import TaskError
from rollyard.tasks.families.base import PASS_FRACTION_MARK, Family, ToolCall
from rollyard.tasks.families.bugfix import BugfixFamily
from rollyard.tasks.families.lookup import LookupFamily
from rollyard.tasks.families.readout import ReadoutFamily
from rollyard.tasks.families.stage import StageFamily
from rollyard.tasks.families.sums import SumsFamily
from rollyard.tasks.model import Task
from rollyard.tasks.writer import write_task

FAMILIES: dict[str, Family] = {
    f.name: f for f in (LookupFamily(), ReadoutFamily(), StageFamily(), BugfixFamily(), SumsFamily())
}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise TaskError(f"unknown task family {name!r}; known: {', '.join(sorted(FAMILIES))}") from None


def generate(family: str, out: Path | str, n: int, seed: int = 0, *, overwrite: bool = False) -> list[Path]:
    """Write ``n`` instances of ``family`` under ``out``; the same seed gives the same tasks."""
    if n < 1:
        raise TaskError(f"n must be at least 1, got {n}")
    fam = get_family(family)
    out = Path(out)
    paths = []
    for i in range(n):
        task_id = f"{family}-s{seed}-{i:05d}"
        files = fam.make(random.Random(f"{family}:{seed}:{i}"), task_id)
        paths.append(write_task(out / task_id, files, overwrite=overwrite))
    return paths


def solve(task: Task, *, mistake_prob: float = 0.0, seed: int = 0) -> list[ToolCall]:
    """The scripted solver's tool calls for ``task``; deterministic for a given seed."""
    fam = get_family(task.spec.family)
    return fam.solve(task, random.Random(f"{task.id}:{seed}"), mistake_prob)


__all__ = ["FAMILIES", "PASS_FRACTION_MARK", "Family", "ToolCall", "generate", "get_family", "solve"]
