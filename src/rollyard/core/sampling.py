"""Sampling parameters shared by engines, the gateway and agents."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SamplingParams(BaseModel):
    """What one generation call asks of an engine.

    ``regex`` and ``grammar`` (xgrammar EBNF) constrain the output (vLLM structured outputs):
    the gateway forces tool calls with a grammar built from the tools' schemas
    (``engines.tool_grammar``). A grammar can be many kilobytes for a CLI's two dozen tools, so it
    is left out of dumps (what a turn records as its sampling); the turn is flagged
    ``constrained_decoding`` instead.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=-1, ge=-1)
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    regex: str | None = None
    grammar: str | None = Field(default=None, exclude=True)
    # alternatives per position a client asked for (OpenAI ``top_logprobs``): returned to it,
    # never recorded, so left out of the turn's sampling too
    top_logprobs: int = Field(default=0, ge=0, le=20, exclude=True)
    logprobs: bool = True
    ignore_eos: bool = False

    @property
    def constrained(self) -> bool:
        return self.regex is not None or self.grammar is not None
