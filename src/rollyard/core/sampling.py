"""Sampling parameters shared by engines, the gateway and agents."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """What one generation call asks of an engine.

    ``regex`` constrains the output (vLLM structured outputs); it lets a random tiny model
    emit a valid tool call in tests and implements ``tool_choice: required``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    regex: str | None = None
    logprobs: bool = True
    ignore_eos: bool = False
