from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rollyard.core.errors import TaskError
from rollyard.sandbox.base import ExecResult, SandboxProvider
from rollyard.sandbox.pool import SandboxPool
from rollyard.tasks import (
    Task,
    TaskFiles,
    TaskSpec,
    Timeouts,
    apply_solution,
    evaluate,
    load_task,
    outcome_from,
    pass_fraction,
    prepare,
    write_task,
)
from rollyard.tasks.sandboxing import sandbox_spec, set_up

MakeTask = Callable[..., Task]


def test_pass_fraction_reads_the_marked_line_then_a_pytest_summary() -> None:
    assert pass_fraction("x\nROLLYARD_PASS_FRACTION=0.25\nROLLYARD_PASS_FRACTION=0.5\n") == 0.5
    assert pass_fraction("== 3 failed, 1 passed in 0.1s ==") == 0.25
    assert pass_fraction("1 passed, 1 error in 2s") == 0.5
    assert pass_fraction("nothing to see") is None
    assert pass_fraction("ROLLYARD_PASS_FRACTION=7") == 1.0


def test_a_timed_out_test_command_is_a_timeout_outcome() -> None:
    out = outcome_from(ExecResult(rc=-9, stdout="", stderr="", timed_out=True), 1.0)
    assert (out.status, out.passed, out.pass_fraction) == ("timeout", False, 0.0)
    failed = outcome_from(ExecResult(rc=1, stdout="ROLLYARD_PASS_FRACTION=0.5", stderr=""), 1.0)
    assert (failed.status, failed.passed, failed.pass_fraction) == ("failure", False, 0.5)


async def test_hidden_tests_are_never_in_the_agents_sandbox(
    make_task: MakeTask, provider: SandboxProvider
) -> None:
    task = make_task("bugfix", seed=1)
    sb = await prepare(task, provider)
    try:
        listing = await sb.snapshot()
        res = await sb.exec("ls -a; ls -a ..", timeout=30)
    finally:
        await sb.close()
    test_names = {p.name for p in task.tests_dir.iterdir()}
    assert set(listing) == {p.name for p in task.workspace_dir.iterdir()}  # type: ignore[union-attr]
    assert not any(name in res.stdout for name in test_names)
    assert task.spec.tests_dest not in res.stdout


async def test_evaluate_accepts_a_directory_or_a_file_map(
    make_task: MakeTask, provider: SandboxProvider, tmp_path: Path
) -> None:
    task = make_task("lookup", seed=2)
    answer = (task.solution_dir / "answer.txt").read_bytes()
    final = tmp_path / "final"
    final.mkdir()
    (final / "answer.txt").write_bytes(answer)
    assert (await evaluate(task, final, provider)).passed
    assert (await evaluate(task, {"answer.txt": answer}, provider)).passed
    wrong = await evaluate(task, {"answer.txt": b"nope"}, provider)
    assert (wrong.passed, wrong.status) == (False, "failure")
    with pytest.raises(TaskError, match="not a directory"):
        await evaluate(task, tmp_path / "missing", provider)


async def test_a_planted_fake_test_is_replaced_by_the_real_one(
    make_task: MakeTask, provider: SandboxProvider
) -> None:
    task = make_task("lookup", seed=3)
    planted = {f"{task.spec.tests_dest}/check.py": b"print('ROLLYARD_PASS_FRACTION=1')\n"}
    out = await evaluate(task, planted, provider)
    assert out.passed is False and out.pass_fraction == 0.0


def _custom(tmp_path: Path, **over: object) -> TaskFiles:
    spec = {"id": "c", "family": "custom", "instruction": "make ok.txt", "test_command": "test -f ok.txt"}
    return TaskFiles(
        spec=TaskSpec.model_validate({**spec, **over}),
        workspace={"README": "hi\n"},
        tests={"t.sh": "true\n"},
        solution={"ok.txt": "1\n"},
    )


async def test_a_hanging_test_command_times_out_and_frees_the_sandbox(
    provider: SandboxProvider, sandbox_dirs: Callable[[], set[str]], tmp_path: Path
) -> None:
    files = _custom(tmp_path, test_command="sleep 600", timeouts=Timeouts(test_s=1.0))
    task = load_task(write_task(tmp_path / "hang", files))
    before = sandbox_dirs()
    out = await evaluate(task, {"ok.txt": b"1"}, provider)
    assert out.status == "timeout" and out.passed is False
    assert sandbox_dirs() - before == set()


async def test_a_failing_setup_script_is_a_task_error_and_leaves_nothing(
    provider: SandboxProvider, sandbox_dirs: Callable[[], set[str]], tmp_path: Path
) -> None:
    files = _custom(tmp_path, setup="setup.sh")
    files.extra["setup.sh"] = "echo boom >&2; exit 3\n"
    task = load_task(write_task(tmp_path / "bad", files))
    before = sandbox_dirs()
    with pytest.raises(TaskError, match="setup script failed with exit status 3: boom"):
        await prepare(task, provider)
    assert sandbox_dirs() - before == set()


async def test_setup_runs_and_its_declared_artefacts_are_removed(
    provider: SandboxProvider, tmp_path: Path
) -> None:
    files = _custom(tmp_path, setup="setup.sh", hygiene_artefacts=["install.log", "cache/**"])
    files.extra["setup.sh"] = "mkdir -p src cache/x; echo made > src/app.py; echo log > install.log\n"
    files.extra["setup.sh"] += "echo c > cache/x/y\n"
    task = load_task(write_task(tmp_path / "setup", files))
    sb = await prepare(task, provider)
    try:
        listing = await sb.snapshot()
    finally:
        await sb.close()
    assert "src/app.py" in listing and "README" in listing
    assert not any(p.startswith(("cache/x", "install.log", ".rollyard_setup")) for p in listing)


async def test_a_pooled_sandbox_runs_the_setup_too(provider: SandboxProvider, tmp_path: Path) -> None:
    """The rollout's pool prepares sandboxes with the same ``set_up`` as ``prepare``."""
    files = _custom(tmp_path, setup="setup.sh", hygiene_artefacts=["install.log"])
    files.extra["setup.sh"] = "mkdir -p src; echo made > src/app.py; echo log > install.log\n"
    task = load_task(write_task(tmp_path / "pooled", files))
    pool = SandboxPool(provider, ahead=0, deadline_s=60)
    pool.register(task.id, sandbox_spec(task, provider), prepare=lambda sb: set_up(task, sb), ahead=0)
    try:
        sb = await pool.acquire(task.id, "prog-1")
        listing = await sb.snapshot()
        await pool.release("prog-1")
    finally:
        await pool.close()
    assert "src/app.py" in listing
    assert not any(p.startswith(("install.log", ".rollyard_setup")) for p in listing)
    assert pool.stats.leaks == 0


async def test_a_script_solution_is_run_and_then_removed(provider: SandboxProvider, tmp_path: Path) -> None:
    files = _custom(tmp_path, solution="script")
    files.solution = {"solve.sh": "echo 1 > ok.txt\n"}
    task = load_task(write_task(tmp_path / "script", files))
    sb = await prepare(task, provider)
    try:
        await apply_solution(task, sb)
        listing = await sb.snapshot()
        out = await evaluate(task, sb, provider)
    finally:
        await sb.close()
    assert "ok.txt" in listing and not any(p.startswith(".rollyard_solution") for p in listing)
    assert out.passed
