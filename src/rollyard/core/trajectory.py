"""Token-exact records of what the policy saw and produced.

A ``Turn`` is one engine call. A ``Segment`` is a run of turns whose prompts extend each
other verbatim (prompt[i+1] starts with prompt[i] + completion[i]); the invariant is checked
on construction, so a silent re-tokenization cannot get into training data. A history rewrite
(context management) ends a segment and is recorded as an ``Event``.
"""

from __future__ import annotations

import math
from array import array
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollyard.core.assemble import assemble
from rollyard.core.events import ContextRewriteEvent, Event
from rollyard.core.events import EventKind as EventKind  # re-exported: the old home
from rollyard.core.ids import new_id
from rollyard.core.prompt_ids import PromptIds

SCHEMA_VERSION = 1

# Engines return log-probabilities <= 0; allow float noise above zero.
_LOGPROB_MAX = 1e-4


def _non_negative(ids: list[int]) -> bool:
    """No id below 0. An unsigned array refuses a negative one as it copies them in, about
    twice as fast as ``min`` (4k ids: ~70 -> ~30 us); an id past 64 bits is left to ``min``."""
    try:
        array("L", ids)
    except OverflowError:
        return min(ids) >= 0
    return True


class FinishReason(StrEnum):
    STOP = "stop"
    LENGTH = "length"
    ABORT = "abort"


class TurnTimings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    submitted: float = 0.0
    started: float = 0.0
    finished: float = 0.0

    @property
    def latency(self) -> float:
        return self.finished - self.submitted


class Turn(BaseModel):
    """One engine call: prompt ids in, completion ids and their logprobs out."""

    model_config = ConfigDict(extra="forbid")

    index: int = Field(default=0, ge=0)
    prompt_ids: list[int]
    completion_ids: list[int]
    completion_logprobs: list[float]
    loss_mask: list[int] | None = None  # per completion token; None means all ones
    policy_version: int = Field(default=0, ge=0)
    finish_reason: FinishReason = FinishReason.STOP
    timings: TurnTimings = Field(default_factory=TurnTimings)
    engine: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict)  # what was applied
    requested_sampling: dict[str, Any] = Field(default_factory=dict)  # what the agent asked
    flags: list[str] = Field(default_factory=list)  # e.g. "malformed_tool_call"
    # [start, stop) runs of completion positions sampled under a grammar (a forced tool call):
    # their logprobs are the grammar-constrained distribution's, not the policy's, so the trainer
    # leaves them out of importance ratios, corrections and mismatch masks (docs/training.md)
    forced: list[tuple[int, int]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check(self) -> Turn:
        n = len(self.completion_ids)
        end = 0
        for a, b in self.forced:
            if not end <= a < b <= n:
                raise ValueError(f"turn {self.index}: forced runs must be ordered, disjoint, within {n}")
            end = b
        if len(self.completion_logprobs) != n:
            raise ValueError(
                f"turn {self.index}: {n} completion ids but {len(self.completion_logprobs)} logprobs"
            )
        if self.loss_mask is not None:
            if len(self.loss_mask) != n:
                raise ValueError(f"turn {self.index}: loss mask length {len(self.loss_mask)} != {n}")
            if any(m not in (0, 1) for m in self.loss_mask):
                raise ValueError(f"turn {self.index}: loss mask must be 0/1")
        if not self.prompt_ids:
            raise ValueError(f"turn {self.index}: empty prompt")
        # The checks run in C: a turn is built on the gateway's event loop for every call, and a
        # generator over a 4k-token agent prompt cost ~150 us of it.
        prompt = self.prompt_ids.unchecked() if isinstance(self.prompt_ids, PromptIds) else self.prompt_ids
        if not (_non_negative(prompt) and _non_negative(self.completion_ids)):
            raise ValueError(f"turn {self.index}: negative token id")
        if n and not (
            max(self.completion_logprobs) <= _LOGPROB_MAX
            and all(map(math.isfinite, self.completion_logprobs))
        ):
            bad = next(lp for lp in self.completion_logprobs if not math.isfinite(lp) or lp > _LOGPROB_MAX)
            raise ValueError(f"turn {self.index}: logprob {bad!r} is not a finite value <= 0")
        return self

    @classmethod
    def of_valid_parts(
        cls,
        *,
        index: int,
        prompt_ids: list[int],
        completion_ids: list[int],
        completion_logprobs: list[float],
        policy_version: int,
        finish_reason: FinishReason,
        timings: TurnTimings,
        engine: str | None,
        sampling: dict[str, Any],
        requested_sampling: dict[str, Any],
        flags: list[str],
        forced: list[tuple[int, int]] | None = None,
    ) -> Turn:
        """The turn of parts whose types are right already: the gateway's prompt ids (its
        tokenizer's, or a validated request body's) and the engine's validated ``Completion``.

        Pydantic does not walk every id and logprob a second time on the event loop; the turn's
        invariants (``_check`` and the two bounds) are still checked, and a turn that fails them
        is built the validated way, so it raises the very error it always did (a part of the
        wrong type, which ``_check`` may trip over, is handled that way too)."""
        fields: dict[str, Any] = {
            "index": index,
            "prompt_ids": prompt_ids,
            "completion_ids": completion_ids,
            "completion_logprobs": completion_logprobs,
            "loss_mask": None,
            "policy_version": policy_version,
            "finish_reason": finish_reason,
            "timings": timings,
            "engine": engine,
            "sampling": sampling,
            "requested_sampling": requested_sampling,
            "flags": flags,
            "forced": forced or [],
        }
        # loss_mask (and forced, when none) keep their defaults, as in Turn(...)
        defaults = {"loss_mask"} if forced else {"loss_mask", "forced"}
        if index >= 0 and policy_version >= 0:
            turn = assemble(cls, fields, fields_set=fields.keys() - defaults)
            try:
                return turn._check()
            except (TypeError, ValueError):
                pass
        return cls(**{k: v for k, v in fields.items() if k not in defaults or k == "loss_mask"})

    @property
    def mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * len(self.completion_ids)

    @property
    def total_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.completion_ids)


class Segment(BaseModel):
    """Turns whose prompts extend each other: trainable as one sequence."""

    model_config = ConfigDict(extra="forbid")

    turns: list[Turn] = Field(default_factory=list)

    @model_validator(mode="after")
    def _check_extends(self) -> Segment:
        for prev, cur in zip(self.turns, self.turns[1:], strict=False):
            if not extends(prev, cur.prompt_ids):
                raise ValueError(
                    f"turn {cur.index} does not extend turn {prev.index}: a rewrite must start a new segment"
                )
        return self

    def accepts(self, prompt_ids: list[int]) -> bool:
        """Whether a new turn with this prompt may be appended to the segment."""
        return not self.turns or extends(self.turns[-1], prompt_ids)

    def forced_mask(self) -> list[int] | None:
        """Per token of ``flatten``'s sequence, 1 where a grammar forced it (``Turn.forced``);
        ``None`` when no turn was constrained."""
        if not any(t.forced for t in self.turns):
            return None
        last = self.turns[-1]
        out = [0] * (len(last.prompt_ids) + len(last.completion_ids))
        for t in self.turns:
            start = len(t.prompt_ids)
            for a, b in t.forced:
                out[start + a : start + b] = [1] * (b - a)
        return out

    def flatten(self) -> tuple[list[int], list[int], list[float]]:
        """The segment as one sequence: ids, loss mask and behaviour logprobs per token.

        Prompt and observation tokens carry mask 0 and logprob 0.0; completion tokens carry
        their turn's mask and logprob.
        """
        if not self.turns:
            return [], [], []
        last = self.turns[-1]
        ids = list(last.prompt_ids) + list(last.completion_ids)
        mask = [0] * len(ids)
        logprobs = [0.0] * len(ids)
        for t in self.turns:
            start = len(t.prompt_ids)
            for j, (m, lp) in enumerate(zip(t.mask, t.completion_logprobs, strict=True)):
                mask[start + j] = m
                logprobs[start + j] = lp
        return ids, mask, logprobs


def extends(prev: Turn, prompt_ids: list[int]) -> bool:
    """True when ``prompt_ids`` starts with prev's prompt followed by its completion."""
    p, c = prev.prompt_ids, prev.completion_ids
    n = len(p) + len(c)
    return len(prompt_ids) >= n and prompt_ids[: len(p)] == p and prompt_ids[len(p) : n] == c


class Outcome(BaseModel):
    """How the program ended and what it earned."""

    model_config = ConfigDict(extra="forbid")

    status: str = "unknown"  # "success", "failure", "error", "timeout", ...
    passed: bool | None = None
    pass_fraction: float | None = Field(default=None, ge=0.0, le=1.0)
    reward: float | None = None
    reward_terms: dict[str, float] = Field(default_factory=dict)
    duration_s: float | None = None
    details: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _finite(self) -> Outcome:
        values = [self.reward, *self.reward_terms.values()]
        if any(v is not None and not math.isfinite(v) for v in values):
            raise ValueError("outcome rewards must be finite")
        return self


class Trajectory(BaseModel):
    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    id: str = Field(default_factory=lambda: new_id("traj"))
    program_id: str
    group_id: str = "default"
    task_id: str = "default"
    segments: list[Segment] = Field(default_factory=list)
    events: list[Event] = Field(default_factory=list)
    outcome: Outcome | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check_version(self) -> Trajectory:
        if self.schema_version != SCHEMA_VERSION:
            raise ValueError(f"schema version {self.schema_version} is not {SCHEMA_VERSION}")
        return self

    @property
    def turns(self) -> list[Turn]:
        return [t for s in self.segments for t in s.turns]

    @property
    def num_turns(self) -> int:
        return sum(len(s.turns) for s in self.segments)

    @property
    def completion_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)

    @property
    def policy_versions(self) -> list[int]:
        return [t.policy_version for t in self.turns]

    def add_turn(self, turn: Turn, *, at: float = 0.0) -> bool:
        """Append a turn, opening a new segment (and a rewrite event) when it does not extend.

        Returns True when a new segment was started because of a history rewrite.
        """
        rewrite = bool(self.segments) and not self.segments[-1].accepts(turn.prompt_ids)
        if not self.segments or rewrite:
            if rewrite:
                rewrite_event = ContextRewriteEvent(reason="not_extending", segment=len(self.segments))
                self.events.append(Event.of(rewrite_event, turn_index=turn.index, at=at))
            self.segments.append(Segment())
        seg = self.segments[-1]
        seg.turns.append(turn)
        return rewrite


class Group(BaseModel):
    """The G programs of one task in one GRPO-style step."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(default_factory=lambda: new_id("group"))
    task_id: str = "default"
    trajectories: list[Trajectory] = Field(default_factory=list)

    @model_validator(mode="after")
    def _members(self) -> Group:
        for t in self.trajectories:
            if t.group_id != self.id:
                raise ValueError(f"trajectory {t.id} belongs to group {t.group_id}, not {self.id}")
        return self

    @property
    def size(self) -> int:
        return len(self.trajectories)

    @property
    def rewards(self) -> list[float | None]:
        return [t.outcome.reward if t.outcome else None for t in self.trajectories]
