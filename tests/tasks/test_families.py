from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest

from rollyard.core.errors import TaskError
from rollyard.sandbox.base import Sandbox, SandboxProvider
from rollyard.tasks import FAMILIES, Task, ToolCall, evaluate, generate, load_task, prepare, solve
from rollyard.tasks.evaluate import Outcome
from rollyard.tasks.families.base import Step, bash, submit, with_mistakes, write_file
from rollyard.tasks.families.stage import next_stage

MakeTask = Callable[..., Task]


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


async def replay(calls: list[ToolCall], sb: Sandbox) -> None:
    for c in calls:
        if c.name == "bash":
            await sb.exec(c.arguments["command"], timeout=30)
        elif c.name == "write_file":
            await sb.write(c.arguments["path"], c.arguments["content"])
        elif c.name == "read_file":
            await sb.read(c.arguments["path"])
        elif c.name == "submit":
            return
        else:
            raise AssertionError(f"unknown tool {c.name}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_same_seed_generates_the_same_tasks(tmp_path: Path, family: str) -> None:
    a = generate(family, tmp_path / "a", 3, seed=7)
    b = generate(family, tmp_path / "b", 3, seed=7)
    c = generate(family, tmp_path / "c", 3, seed=8)
    assert [_tree(p) for p in a] == [_tree(p) for p in b]
    assert [_tree(p)["task.yaml"] for p in a] != [_tree(p)["task.yaml"] for p in c]


def test_generation_rejects_unknown_families_and_empty_counts(tmp_path: Path) -> None:
    with pytest.raises(TaskError, match="unknown task family 'nope'"):
        generate("nope", tmp_path, 1)
    with pytest.raises(TaskError, match="at least 1"):
        generate("lookup", tmp_path, 0)
    generate("lookup", tmp_path, 1)
    with pytest.raises(TaskError, match="already exists"):
        generate("lookup", tmp_path, 1)


def test_a_lookup_key_appears_once_and_its_value_is_the_golden_answer(tmp_path: Path) -> None:
    for path in generate("lookup", tmp_path, 20, seed=3):
        task = load_task(path)
        key, value = task.spec.metadata["key"], task.spec.metadata["value"]
        lines = [ln for f in (path / "workspace" / "data").iterdir() for ln in f.read_text().splitlines()]
        hits = [ln for ln in lines if ln.startswith(f"{key}=")]
        assert hits == [f"{key}={value}"]
        assert (path / "solution" / "answer.txt").read_text().strip() == value
        assert key in task.spec.instruction and len(task.spec.instruction) < 80


def test_the_lookup_solver_is_grep_write_submit_without_mistakes(make_task: MakeTask) -> None:
    task = make_task("lookup", seed=1)
    calls = solve(task)
    assert [c.name for c in calls] == ["bash", "write_file", "submit"]
    assert calls[1].arguments == {"path": "answer.txt", "content": task.spec.metadata["value"]}
    assert not any(c.mistake for c in calls)


def test_mistakes_precede_each_correct_step_at_probability_one() -> None:
    steps = [Step(call=bash("a"), detours=[bash("x")]), Step(call=write_file("f", "1")), Step(call=submit())]
    calls = with_mistakes(steps, random.Random(0), 1.0)
    assert [(c.arguments.get("command"), c.mistake) for c in calls[:2]] == [("x", True), ("a", False)]
    assert len(calls) == 4  # only the step that has detours gains one
    with pytest.raises(ValueError, match="mistake_prob"):
        with_mistakes(steps, random.Random(0), 1.5)


def test_the_solver_is_deterministic_per_seed(make_task: MakeTask) -> None:
    task = make_task("sums", seed=2)
    assert solve(task, mistake_prob=0.5, seed=1) == solve(task, mistake_prob=0.5, seed=1)
    runs = {str(solve(task, mistake_prob=0.5, seed=s)) for s in range(10)}
    assert len(runs) > 1


async def outcome_of(task: Task, calls: list[ToolCall], provider: SandboxProvider) -> Outcome:
    sb = await prepare(task, provider)
    try:
        await replay(calls, sb)
        return await evaluate(task, sb, provider)
    finally:
        await sb.close()


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_the_scripted_solver_solves_its_instance(
    make_task: MakeTask, provider: SandboxProvider, family: str
) -> None:
    task = make_task(family, seed=5)
    calls = solve(task, mistake_prob=0.0, seed=3)
    assert not any(c.mistake for c in calls)
    outcome = await outcome_of(task, calls, provider)
    assert outcome.passed, outcome.details
    assert outcome.pass_fraction == 1.0


@pytest.mark.parametrize("family", ["bugfix", "lookup", "sums"])
async def test_detour_mistakes_still_end_in_a_solved_instance(
    make_task: MakeTask,
    provider: SandboxProvider,
    family: str,
) -> None:
    task = make_task(family, seed=5)
    calls = solve(task, mistake_prob=0.7, seed=3)
    assert any(c.mistake for c in calls)
    outcome = await outcome_of(task, calls, provider)
    assert outcome.passed, outcome.details
    assert outcome.pass_fraction == 1.0


async def test_a_stage_guess_skips_the_look_and_passes_only_when_lucky(
    make_task: MakeTask, provider: SandboxProvider
) -> None:
    task = make_task("stage", seed=5)
    meta = task.spec.metadata
    assert meta["target"] == next_stage(meta["current"])
    guesses = [solve(task, mistake_prob=1.0, seed=s) for s in range(12)]
    assert all([c.name for c in g] == ["write_file", "submit"] for g in guesses)
    wrong = next(g for g in guesses if g[0].mistake)
    right = next(g for g in guesses if not g[0].mistake)
    assert wrong[0].arguments["content"] != meta["target"] == right[0].arguments["content"]
    assert not (await outcome_of(task, wrong, provider)).passed
    assert (await outcome_of(task, right, provider)).passed
    assert [c.name for c in solve(task, mistake_prob=0.0, seed=0)] == ["bash", "submit"]


async def test_a_readout_guess_skips_the_read_and_passes_only_when_lucky(
    make_task: MakeTask, provider: SandboxProvider
) -> None:
    task = make_task("readout", seed=5)
    value = task.spec.metadata["value"]
    read = solve(task, mistake_prob=0.0, seed=0)
    assert [c.name for c in read] == ["bash", "write_file", "submit"]
    assert read[1].arguments == {"path": "answer.txt", "content": value}
    guesses = [solve(task, mistake_prob=1.0, seed=s) for s in range(8)]
    assert all([c.name for c in g] == ["write_file", "submit"] for g in guesses)  # no look first
    wrong = next(g for g in guesses if g[0].arguments["content"] != value)
    assert wrong[0].mistake
    assert not (await outcome_of(task, wrong, provider)).passed
    assert (await outcome_of(task, read, provider)).passed
