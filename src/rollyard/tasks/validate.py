"""Validation (ROLL's data lesson): keep a task only if its golden solution passes the hidden
tests, doing nothing fails them, and (optionally) a judge panel finds instruction and tests
consistent. Concurrent, and resumable through an append-only journal of verdicts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.clock import Clock, SystemClock
from rollyard.core.errors import RollyardError, TaskError
from rollyard.core.trajectory import Outcome
from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks.evaluate import evaluate
from rollyard.tasks.judges import JudgePanel, JudgeVote
from rollyard.tasks.model import Task
from rollyard.tasks.sandboxing import apply_solution, prepare

log = logging.getLogger(__name__)

JOURNAL = "journal.jsonl"
REPORT = "report.json"
KEPT_LIST = "kept.txt"
KEPT_DIR = "tasks"

GOLDEN_FAILS = "golden solution fails the hidden tests"
NOOP_PASSES = "the unchanged workspace passes the hidden tests"
JUDGES_REJECT = "judge panel found instruction and tests inconsistent"


class TaskVerdict(BaseModel):
    model_config = ConfigDict(extra="forbid")

    task_id: str
    path: str
    keep: bool
    reasons: list[str] = Field(default_factory=list)
    golden: Outcome | None = None
    noop: Outcome | None = None
    judges: list[JudgeVote] = Field(default_factory=list)
    error: str | None = None
    duration_s: float = 0.0


class ValidationReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    total: int
    kept: int
    reasons: dict[str, int]
    verdicts: list[TaskVerdict]

    def summary(self) -> str:
        why = ", ".join(f"{n} x {r}" for r, n in sorted(self.reasons.items())) or "none dropped"
        return f"validated {self.total} tasks: kept {self.kept}, dropped {self.total - self.kept} ({why})"


async def _golden(task: Task, provider: SandboxProvider) -> Outcome:
    sb = await prepare(task, provider)
    try:
        await apply_solution(task, sb)
        return await evaluate(task, sb, provider)
    finally:
        await sb.close()


async def _noop(task: Task, provider: SandboxProvider) -> Outcome:
    sb = await prepare(task, provider)
    try:
        return await evaluate(task, sb, provider)
    finally:
        await sb.close()


async def validate_task(
    task: Task, provider: SandboxProvider, *, panel: JudgePanel | None = None, clock: Clock | None = None
) -> TaskVerdict:
    """Judge one task; a failing setup or solution script yields a dropped verdict, not a crash."""
    clock = clock or SystemClock()
    t0 = clock.now()
    v = TaskVerdict(task_id=task.id, path=str(task.root), keep=False)
    try:
        v.golden = await _golden(task, provider)
        v.noop = await _noop(task, provider)
    except RollyardError as e:
        v.error = e.message
        v.reasons.append(f"error: {e.message}"[:300])
        v.duration_s = clock.now() - t0
        return v
    if not v.golden.passed:
        v.reasons.append(GOLDEN_FAILS)
    if v.noop.passed:
        v.reasons.append(NOOP_PASSES)
    if panel is not None and not v.reasons:  # judges only review tasks that survived the checks
        verdict = await panel.review(task)
        v.judges = verdict.votes
        if not verdict.keep:
            v.reasons.append(JUDGES_REJECT)
    v.keep = not v.reasons
    v.duration_s = clock.now() - t0
    return v


def read_journal(path: Path) -> dict[str, TaskVerdict]:
    """Verdicts already recorded, by task id; a torn last line (a crash mid-write) is ignored."""
    done: dict[str, TaskVerdict] = {}
    if not path.is_file():
        return done
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            v = TaskVerdict.model_validate_json(line)
        except ValueError:
            log.warning("journal %s:%d unreadable, will redo that task", path, n)
            continue
        done[v.task_id] = v
    return done


def _report(verdicts: list[TaskVerdict]) -> ValidationReport:
    reasons = Counter(r if not r.startswith("error:") else "error" for v in verdicts for r in v.reasons)
    return ValidationReport(
        total=len(verdicts), kept=sum(v.keep for v in verdicts), reasons=dict(reasons), verdicts=verdicts
    )


def write_outputs(report: ValidationReport, out: Path, *, copy_kept: bool = False) -> None:
    """report.json, kept.txt (one kept task dir per line) and optionally a copy of kept tasks."""
    (out / REPORT).write_text(report.model_dump_json(indent=2))
    kept = [v for v in report.verdicts if v.keep]
    (out / KEPT_LIST).write_text("".join(f"{v.path}\n" for v in kept))
    if copy_kept:
        dest = out / KEPT_DIR
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir()
        for v in kept:
            shutil.copytree(v.path, dest / Path(v.path).name)


async def validate_tasks(
    tasks: list[Task],
    provider: SandboxProvider,
    out: Path,
    *,
    concurrency: int = 4,
    panel: JudgePanel | None = None,
    copy_kept: bool = False,
    on_done: Callable[[TaskVerdict, bool], None] | None = None,
) -> ValidationReport:
    """Validate ``tasks`` with at most ``concurrency`` at a time; tasks already in ``out``'s
    journal are not redone. ``on_done(verdict, resumed)`` is called once per task."""
    if concurrency < 1:
        raise TaskError(f"concurrency must be at least 1, got {concurrency}")
    out.mkdir(parents=True, exist_ok=True)
    journal = out / JOURNAL
    done = read_journal(journal)
    if journal.is_file() and not journal.read_bytes().endswith(b"\n") and journal.stat().st_size:
        with journal.open("a") as f:  # close a line torn by a crash, so new records start clean
            f.write("\n")
    sem = asyncio.Semaphore(concurrency)
    verdicts: dict[str, TaskVerdict] = {}

    async def one(task: Task) -> None:
        if task.id in done:
            verdicts[task.id] = done[task.id]
            if on_done:
                on_done(done[task.id], True)
            return
        async with sem:
            v = await validate_task(task, provider, panel=panel)
        with journal.open("a") as f:  # one line per task, flushed before the next is recorded
            f.write(v.model_dump_json() + "\n")
        verdicts[task.id] = v
        log.info("task=%s keep=%s reasons=%s", v.task_id, v.keep, json.dumps(v.reasons))
        if on_done:
            on_done(v, False)

    await asyncio.gather(*(one(t) for t in tasks))
    report = _report([verdicts[t.id] for t in tasks])
    write_outputs(report, out, copy_kept=copy_kept)
    return report
