"""Write a task directory from in-memory parts; what generators produce."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import TaskError
from rollyard.tasks.model import SOLUTION_DIR, TASK_FILE, TESTS_DIR, WORKSPACE_DIR, TaskSpec


class TaskFiles(BaseModel):
    """A task before it is written: spec plus relative path -> text for each part."""

    model_config = ConfigDict(extra="forbid")

    spec: TaskSpec
    workspace: dict[str, str] = Field(default_factory=dict)
    tests: dict[str, str]
    solution: dict[str, str]
    extra: dict[str, str] = Field(default_factory=dict)  # e.g. a setup script at the task root


def _write_tree(root: Path, files: Mapping[str, str]) -> None:
    for rel, text in files.items():
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise TaskError(f"file {rel!r} would land outside {root}")
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def write_task(out: Path, files: TaskFiles, *, overwrite: bool = False) -> Path:
    """Write ``files`` as a task directory at ``out`` and return it."""
    if out.exists():
        if not overwrite:
            raise TaskError(f"{out} already exists")
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spec = files.spec.model_dump(mode="json", exclude_defaults=False)
    (out / TASK_FILE).write_text(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    if files.workspace:
        _write_tree(out / WORKSPACE_DIR, files.workspace)
    _write_tree(out / TESTS_DIR, files.tests)
    _write_tree(out / SOLUTION_DIR, files.solution)
    (out / SOLUTION_DIR).mkdir(exist_ok=True)
    _write_tree(out, files.extra)
    return out
