"""``engine.drafting``: which speculative drafter an engine runs, as vLLM flags and environment."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DRAFTER_CLASSES = {
    "grouped_suffix": "rollyard.engines.drafting.GroupedSuffixDrafter",
    "solo_suffix": "rollyard.engines.drafting.SoloSuffixDrafter",
}
DraftMethod = Literal["none", "grouped_suffix", "solo_suffix", "ngram"]


class DraftingConfig(BaseModel):
    """``method``: ``grouped_suffix`` (ours: a suffix index per RL group), ``solo_suffix`` (ours,
    each request alone), ``ngram`` (vLLM's prompt lookup) or ``none``; ``k``: the most tokens
    drafted per request and step. ``budget`` / ``min_prob`` / ``prior`` tune ours (see
    ``DrafterSettings``)."""

    model_config = ConfigDict(extra="forbid")

    method: DraftMethod = "none"
    k: int = Field(default=4, ge=1, le=16)
    budget: int | None = Field(default=None, ge=0)
    min_prob: float | None = Field(default=None, ge=0.0, le=1.0)
    prior: float | None = Field(default=None, ge=0.0)

    @property
    def enabled(self) -> bool:
        return self.method != "none"

    def speculative_config(self) -> dict[str, object] | None:
        """The ``--speculative-config`` value, or None for no drafting."""
        if self.method == "none":
            return None
        if self.method == "ngram":
            return {
                "method": "ngram",
                "num_speculative_tokens": self.k,
                "prompt_lookup_max": 4,
                "prompt_lookup_min": 2,
            }
        return {
            "method": "custom_class",
            "model": DRAFTER_CLASSES[self.method],
            "num_speculative_tokens": self.k,
        }

    def engine_args(self) -> list[str]:
        spec = self.speculative_config()
        return [] if spec is None else ["--speculative-config", json.dumps(spec)]

    def environment(self) -> dict[str, str]:
        """``ROLLYARD_DRAFT_*`` variables our drafter reads inside the engine."""
        env = {}
        if self.budget is not None:
            env["ROLLYARD_DRAFT_BUDGET"] = str(self.budget)
        if self.min_prob is not None:
            env["ROLLYARD_DRAFT_MIN_PROB"] = str(self.min_prob)
        if self.prior is not None:
            env["ROLLYARD_DRAFT_PRIOR"] = str(self.prior)
        return env

    @classmethod
    def parse(cls, text: str) -> DraftingConfig:
        """The CLI form: ``METHOD`` or ``METHOD:K`` (``grouped_suffix:8``)."""
        method, _, k = text.partition(":")
        return cls.model_validate({"method": method, **({"k": k} if k else {})})
