"""A program: one agent run on one task (ThunderAgent's unit of scheduling)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.ids import new_id, new_key


class ProgramState(StrEnum):
    ACTIVE = "active"
    PAUSED = "paused"
    FINISHED = "finished"
    TERMINATED = "terminated"

    @property
    def is_over(self) -> bool:
        return self in (ProgramState.FINISHED, ProgramState.TERMINATED)


class ProgramPhase(StrEnum):
    """Reasoning while a model request is in flight, acting (running tools) in between."""

    REASONING = "reasoning"
    ACTING = "acting"


class SamplingPolicy(BaseModel):
    """The trainer's sampling settings; they override what the agent asks for."""

    model_config = ConfigDict(extra="forbid")

    temperature: float | None = Field(default=1.0, ge=0.0)
    top_p: float | None = Field(default=1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(default=None, ge=1)
    ignore_eos: bool = False  # generate exactly max_tokens (benchmarks that need set lengths)


class Program(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: new_id("prog"))
    api_key: str = Field(default_factory=new_key, repr=False)
    group_id: str = "default"
    group_size: int = Field(default=1, ge=1)  # programs in its GRPO group (the scheduler's unit)
    task_id: str = "default"
    sampling: SamplingPolicy = Field(default_factory=SamplingPolicy)
    context_limit: int | None = Field(default=None, ge=1)
    state: ProgramState = ProgramState.ACTIVE
    phase: ProgramPhase = ProgramPhase.ACTING
    status: str | None = None  # why it finished: "success", "error", "timeout", ...
    context_tokens: int = 0
    engine: str | None = None
    created_at: float = 0.0
    finished_at: float | None = None
    metadata: dict[str, str] = Field(default_factory=dict)

    def public(self) -> dict[str, object]:
        """The program without its secret, for logs and listings."""
        return self.model_dump(exclude={"api_key"}, mode="json")
