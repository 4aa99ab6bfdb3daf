"""Read task directories (and list files of them) into ``Task`` objects, or say clearly why not."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from rollyard.core.errors import TaskError
from rollyard.tasks.model import SOLUTION_SCRIPT, TASK_FILE, SolutionKind, Task, TaskSpec


def _describe(e: ValidationError) -> str:
    parts = []
    for err in e.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        if err["type"] == "missing":
            parts.append(f"missing field {loc!r}")
        elif err["type"] == "extra_forbidden":
            parts.append(f"unknown field {loc!r}")
        else:
            parts.append(f"{loc}: {err['msg']}")
    return "; ".join(parts)


def load_spec(path: Path) -> TaskSpec:
    """Parse one ``task.yaml``."""
    try:
        raw = yaml.safe_load(path.read_text())
    except FileNotFoundError as e:
        raise TaskError(f"{path.parent}: not a task directory (no {TASK_FILE})") from e
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: not valid YAML: {e}") from e
    if not isinstance(raw, dict):
        raise TaskError(f"{path}: expected a mapping of fields, got {type(raw).__name__}")
    try:
        return TaskSpec.model_validate(raw)
    except ValidationError as e:
        raise TaskError(f"{path}: {_describe(e)}") from e


def load_task(root: Path | str) -> Task:
    """Load and check one task directory: spec, hidden tests, golden solution, a starting point."""
    root = Path(root)
    if not root.is_dir():
        raise TaskError(f"{root}: no such task directory")
    spec = load_spec(root / TASK_FILE)
    task = Task(root=root.resolve(), spec=spec)
    if not task.tests_dir.is_dir() or not any(task.tests_dir.iterdir()):
        raise TaskError(f"{root}: hidden tests/ directory is missing or empty")
    if not task.solution_dir.is_dir():
        raise TaskError(f"{root}: golden solution/ directory is missing")
    if spec.solution is SolutionKind.SCRIPT and not (task.solution_dir / SOLUTION_SCRIPT).is_file():
        raise TaskError(f"{root}: solution kind is 'script' but solution/{SOLUTION_SCRIPT} is missing")
    script = task.setup_script
    if script is not None and not script.is_file():
        raise TaskError(f"{root}: setup script {spec.setup!r} does not exist")
    if task.workspace_dir is None and script is None:
        raise TaskError(f"{root}: needs a workspace/ directory or a setup script")
    return task


def task_dirs(source: Path | str) -> list[Path]:
    """The task directories named by ``source``: a task dir, a dir of task dirs, or a list file."""
    source = Path(source)
    if source.is_file():
        base = source.parent
        lines = [ln.strip() for ln in source.read_text().splitlines()]
        return [base / ln for ln in lines if ln and not ln.startswith("#")]  # absolute ln wins in /
    if not source.is_dir():
        raise TaskError(f"{source}: no such task directory or list file")
    if (source / TASK_FILE).is_file():
        return [source]
    return sorted(p for p in source.iterdir() if (p / TASK_FILE).is_file())


def load_tasks(source: Path | str) -> list[Task]:
    """Load every task ``source`` names; ids must be unique."""
    tasks = [load_task(d) for d in task_dirs(source)]
    seen: dict[str, Path] = {}
    for t in tasks:
        if t.id in seen:
            raise TaskError(f"duplicate task id {t.id!r} in {seen[t.id]} and {t.root}")
        seen[t.id] = t.root
    return tasks
