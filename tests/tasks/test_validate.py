from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rollyard.core.errors import TaskError
from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks import TaskVerdict, generate, load_task, load_tasks, validate_tasks
from rollyard.tasks.validate import GOLDEN_FAILS, JOURNAL, NOOP_PASSES, read_journal


def _task_set(root: Path) -> Path:
    """Two good lookup tasks, one whose golden is wrong, one already solved at the start."""
    paths = generate("lookup", root, 4, seed=11)
    (paths[2] / "solution" / "answer.txt").write_text("wrong\n")
    shutil.copy(paths[3] / "solution" / "answer.txt", paths[3] / "workspace" / "answer.txt")
    return root


async def test_validation_keeps_good_tasks_and_drops_false_positives(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    src = _task_set(tmp_path / "src")
    out = tmp_path / "out"
    report = await validate_tasks(load_tasks(src), provider, out, concurrency=2, copy_kept=True)
    by_id = {v.task_id: v for v in report.verdicts}
    ids = sorted(by_id)
    assert [by_id[i].keep for i in ids] == [True, True, False, False]
    assert by_id[ids[2]].reasons == [GOLDEN_FAILS]
    assert by_id[ids[3]].reasons == [NOOP_PASSES]
    assert report.reasons == {GOLDEN_FAILS: 1, NOOP_PASSES: 1}
    assert "kept 2, dropped 2" in report.summary()
    assert [t.id for t in load_tasks(out / "kept.txt")] == ids[:2]
    assert sorted(p.name for p in (out / "tasks").iterdir()) == ids[:2]
    saved = json.loads((out / "report.json").read_text())
    assert saved["kept"] == 2 and len(saved["verdicts"]) == 4


async def test_a_rerun_resumes_from_the_journal(provider: SandboxProvider, tmp_path: Path) -> None:
    src = _task_set(tmp_path / "src")
    out = tmp_path / "out"
    tasks = load_tasks(src)
    first = await validate_tasks(tasks[:2], provider, out)
    with (out / JOURNAL).open("a") as f:
        f.write('{"task_id": "torn')  # a crash mid-line
    seen: list[tuple[str, bool]] = []
    second = await validate_tasks(tasks, provider, out, on_done=lambda v, r: seen.append((v.task_id, r)))
    resumed = {tid for tid, r in seen if r}
    assert resumed == {t.id for t in tasks[:2]}
    assert len(seen) == 4
    assert [v.keep for v in second.verdicts[:2]] == [v.keep for v in first.verdicts]
    assert set(read_journal(out / JOURNAL)) == {t.id for t in tasks}


async def test_a_task_whose_setup_fails_is_dropped_with_the_error(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    path = generate("lookup", tmp_path / "src", 1, seed=1)[0]
    (path / "setup.sh").write_text("exit 9\n")
    text = (path / "task.yaml").read_text().replace("setup: null", "setup: setup.sh")
    (path / "task.yaml").write_text(text)
    report = await validate_tasks([load_task(path)], provider, tmp_path / "out")
    v: TaskVerdict = report.verdicts[0]
    assert not v.keep and v.error is not None and "exit status 9" in v.error
    assert report.reasons == {"error": 1}


async def test_concurrency_must_be_positive(provider: SandboxProvider, tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="concurrency"):
        await validate_tasks([], provider, tmp_path, concurrency=0)
