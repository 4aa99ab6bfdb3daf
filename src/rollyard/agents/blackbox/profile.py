"""Runner profiles: how to point one family of CLI agents at its program, as YAML data.

Templates use the variables in ``VARIABLES`` (docs/agents.md lists them too). Any other
``{...}`` is left as written, so JSON config templates work.
"""

from __future__ import annotations

import re
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from rollyard.agents.install import CLIS, AgentCLI, InstallSpec, cli_for
from rollyard.core.errors import ConfigError
from rollyard.sandbox.base import Limits

VARIABLES = {
    "base_url": "the program's OpenAI-style base URL, http://127.0.0.1:PORT/v1 inside the sandbox",
    "origin": "the same without /v1 (Anthropic-style clients)",
    "api_key": "the program's own key (it reaches only this program)",
    "model": "the model name the gateway serves",
    "task": "the task's instruction text",
    "task_file": "a workspace-relative file holding the instruction",
    "agent_dir": "a workspace-relative directory for the runner's files (removed after the run)",
    "examples": "the shipped example agents' directory",
    "install": "where the profile's CLI lives: its pip --target dir, npm prefix, or install.path",
}
_VARS = tuple(VARIABLES)
_GLOB = re.compile(r"^[A-Za-z0-9_.*?/\[\]-]+$")  # no spaces or shell metacharacters
_TEMPLATE = re.compile(r"\{(" + "|".join(_VARS) + r")\}")
AGENT_DIR = ".rollyard_agent"


class TaskInput(StrEnum):
    ARG = "arg"  # the command's templates use {task}
    STDIN = "stdin"
    FILE = "file"  # written to {task_file}


class OutputSource(StrEnum):
    STDOUT = "stdout"
    FILE = "file"


class FinishReply(BaseModel):
    """A short, well-formed last reply for this CLI: what the SFT warm start teaches a model to
    answer its prompts with, then end its turn. Plain text by default (the CLI sees a completed
    turn without a tool call); a CLI that finishes through a tool names the call."""

    model_config = ConfigDict(extra="forbid")

    text: str = "Done."
    tool: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)


class RunnerProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    command: list[str] = Field(min_length=1)
    env: dict[str, str] = Field(default_factory=dict)
    files: dict[str, str] = Field(default_factory=dict)  # workspace-relative path -> template
    task_input: TaskInput = TaskInput.STDIN
    output: OutputSource = OutputSource.STDOUT
    output_file: str | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    hygiene: list[str] = Field(default_factory=list)  # globs removed after the run
    # the CLI the command runs: a pinned one by name (`rollyard agents list`), or the profile's
    # own ({pypi: "pkg==1.2"}, {npm: "pkg@1.2"}, {path: /abs/dir}); `rollyard agents install PROFILE`
    install: str | InstallSpec | None = None
    # sandbox limits this CLI needs (e.g. a Node or Bun CLI's address space), over the run's
    limits: dict[str, Any] = Field(default_factory=dict)
    finish: FinishReply = Field(default_factory=FinishReply)  # the warm start's last reply

    @field_validator("files", "hygiene", mode="after")
    @classmethod
    def _relative(cls, v: dict[str, str] | list[str]) -> dict[str, str] | list[str]:
        for p in v:
            if p.startswith("/") or ".." in Path(p).parts or not _GLOB.match(p):
                raise ValueError(f"{p!r} must be a plain relative path or glob inside the workspace")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> RunnerProfile:
        if self.output is OutputSource.FILE and not self.output_file:
            raise ValueError("output: file needs output_file")
        if self.task_input is TaskInput.ARG and not any("{task}" in c for c in self.command):
            raise ValueError("task_input: arg needs {task} in the command")
        if isinstance(self.install, str) and self.install not in CLIS:
            raise ValueError(f"install: unknown agent CLI {self.install!r}; one of: {', '.join(CLIS)}")
        Limits.model_validate(self.limits)  # unknown keys and bad values fail at load
        return self

    @property
    def cli(self) -> AgentCLI | None:
        """The CLI this profile runs (``None``: the command is on the sandbox's own PATH)."""
        return cli_for(self.install, self.name)

    def sandbox_limits(self, base: Limits) -> Limits:
        """``base`` (the run's limits) with this profile's own on top."""
        return Limits.model_validate({**base.model_dump(), **self.limits})


def render(template: str, values: dict[str, str]) -> str:
    """Substitute the known ``{name}`` placeholders; leave every other brace alone."""
    return _TEMPLATE.sub(lambda m: values.get(m.group(1), m.group(0)), template)


def shipped_profiles() -> list[str]:
    root = resources.files("rollyard.agents") / "profiles"
    return sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".yaml"))


def load_profile(name_or_path: str | Path) -> RunnerProfile:
    """A shipped profile by name (``openai``, ``claude-code``, ...) or a YAML file path."""
    path = Path(name_or_path)
    if not path.is_file():
        shipped = resources.files("rollyard.agents") / "profiles" / f"{name_or_path}.yaml"
        if not shipped.is_file():
            known = ", ".join(shipped_profiles())
            raise ConfigError(f"no runner profile {str(name_or_path)!r} (a file, or one of: {known})")
        text = shipped.read_text()
    else:
        text = path.read_text()
    try:
        raw = yaml.safe_load(text)
        return RunnerProfile.model_validate(raw)
    except (yaml.YAMLError, ValidationError, ValueError) as e:
        raise ConfigError(f"runner profile {str(name_or_path)!r} is invalid: {e}") from e
