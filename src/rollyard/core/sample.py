"""A training sample: one token sequence with per-token mask, behaviour logprobs and advantages."""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollyard.core.trajectory import Segment


class Sample(BaseModel):
    """What the trainer consumes. All per-token lists have ``len(token_ids)`` entries.

    ``logprobs[i]`` and ``advantages[i]`` belong to token i (predicted from position i-1);
    entries where ``loss_mask`` is 0 are ignored by losses.
    """

    model_config = ConfigDict(extra="forbid")

    token_ids: list[int]
    loss_mask: list[int]
    logprobs: list[float]
    advantages: list[float]
    policy_version: int = 0
    group_id: str = "default"
    trajectory_id: str = ""
    reward: float = 0.0
    chunk_ids: list[int] | None = None  # per token: index of its chunk (IPA), -1 outside
    # per token: 1 where a grammar forced it; its logprob is the constrained distribution's, so
    # the loss takes no ratio against it (trained against the proximal policy, docs/training.md)
    forced: list[int] | None = None
    meta: dict[str, float | int | str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> Sample:
        n = len(self.token_ids)
        if n == 0:
            raise ValueError("empty sample")
        for name in ("loss_mask", "logprobs", "advantages"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} tokens")
        if self.chunk_ids is not None and len(self.chunk_ids) != n:
            raise ValueError(f"chunk_ids has {len(self.chunk_ids)} entries for {n} tokens")
        if self.forced is not None and (len(self.forced) != n or any(f not in (0, 1) for f in self.forced)):
            raise ValueError(f"forced must be 0/1 with {n} entries")
        if any(m not in (0, 1) for m in self.loss_mask):
            raise ValueError("loss mask must be 0/1")
        if self.loss_mask[0] == 1:
            raise ValueError("the first token has no context to be predicted from; mask it")
        bad = [x for x in (*self.logprobs, *self.advantages) if not math.isfinite(x)]
        if bad or not math.isfinite(self.reward):
            raise ValueError("logprobs, advantages and reward must be finite")
        return self

    @property
    def num_loss_tokens(self) -> int:
        return sum(self.loss_mask)

    @classmethod
    def from_segment(cls, segment: Segment, advantage: float | list[float] = 0.0, **fields: object) -> Sample:
        """One sample per segment: prompt and observations masked, completions trained."""
        ids, mask, lps = segment.flatten()
        adv = [float(advantage)] * len(ids) if isinstance(advantage, int | float) else list(advantage)
        versions = [t.policy_version for t in segment.turns]
        return cls(
            token_ids=ids,
            loss_mask=mask,
            logprobs=lps,
            advantages=adv,
            policy_version=min(versions) if versions else 0,
            forced=segment.forced_mask(),
            **fields,  # type: ignore[arg-type]
        )
