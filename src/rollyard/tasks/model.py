"""The on-disk task format as typed models (see docs/tasks.md).

A task directory holds ``task.yaml`` (a ``TaskSpec``), the agent's starting files in
``workspace/`` (and/or a setup script), hidden ``tests/`` and a golden ``solution/``. Only the
workspace ever reaches the agent's sandbox; tests are added at evaluation, in a fresh one.
"""

from __future__ import annotations

import re
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

TASK_FILE = "task.yaml"
WORKSPACE_DIR = "workspace"
TESTS_DIR = "tests"
SOLUTION_DIR = "solution"
SOLUTION_SCRIPT = "solve.sh"

_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$"
_GLOB = re.compile(r"^[A-Za-z0-9_.*?/\[\]-]+$")  # no spaces or shell metacharacters


class Timeouts(BaseModel):
    """Seconds allowed for each phase; a phase that runs past its budget fails, never hangs."""

    model_config = ConfigDict(extra="forbid")

    setup_s: float = Field(default=60.0, gt=0)
    agent_s: float = Field(default=600.0, gt=0)
    test_s: float = Field(default=60.0, gt=0)


class Variant(BaseModel):
    """One declared variation of the environment (ROLL's diversity lesson)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)


class SolutionKind(StrEnum):
    OVERLAY = "overlay"  # solution/ files are copied over the workspace
    SCRIPT = "script"  # solution/solve.sh runs in the workspace


class TaskSpec(BaseModel):
    """The contents of ``task.yaml``."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(pattern=_ID_PATTERN)
    family: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    test_command: str = Field(min_length=1)
    tests_dest: str = "_hidden_tests"  # where tests land in the evaluation sandbox
    setup: str | None = None  # a script in the task dir, run in the agent's sandbox before it starts
    solution: SolutionKind = SolutionKind.OVERLAY
    timeouts: Timeouts = Field(default_factory=Timeouts)
    network: bool = False
    metadata: dict[str, Any] = Field(default_factory=dict)
    variants: list[Variant] = Field(default_factory=list)
    hygiene_artefacts: list[str] = Field(default_factory=list)  # globs removed after setup

    @field_validator("instruction", "test_command")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("tests_dest", "setup")
    @classmethod
    def _relative(cls, v: str | None) -> str | None:
        if v is not None and (v.startswith("/") or ".." in Path(v).parts or not v.strip()):
            raise ValueError(f"{v!r} must be a relative path inside the task")
        return v

    @field_validator("hygiene_artefacts")
    @classmethod
    def _relative_globs(cls, v: list[str]) -> list[str]:
        for g in v:
            if g.startswith("/") or ".." in Path(g).parts or not _GLOB.match(g):
                raise ValueError(
                    f"hygiene artefact {g!r} must be a relative glob inside the workspace "
                    "(letters, digits, _ . - / * ? [ ] only)"
                )
        return v


class Task(BaseModel):
    """A loaded task: its spec and where its parts live on the host."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    root: Path
    spec: TaskSpec

    @property
    def id(self) -> str:
        return self.spec.id

    @property
    def workspace_dir(self) -> Path | None:
        d = self.root / WORKSPACE_DIR
        return d if d.is_dir() else None

    @property
    def tests_dir(self) -> Path:
        return self.root / TESTS_DIR

    @property
    def solution_dir(self) -> Path:
        return self.root / SOLUTION_DIR

    @property
    def setup_script(self) -> Path | None:
        return self.root / self.spec.setup if self.spec.setup else None
