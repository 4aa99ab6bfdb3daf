"""``engine.drafting``: which speculative drafter an engine runs, as vLLM flags and environment."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import ConfigError

DRAFTER_CLASSES = {
    "grouped_suffix": "rollyard.engines.drafting.GroupedSuffixDrafter",
    "solo_suffix": "rollyard.engines.drafting.SoloSuffixDrafter",
}
DraftMethod = Literal["none", "grouped_suffix", "solo_suffix", "ngram", "eagle"]


class DraftingConfig(BaseModel):
    """``method``: ``grouped_suffix`` (ours: a suffix index per RL group), ``solo_suffix`` (ours,
    each request alone), ``ngram`` (vLLM's prompt lookup) or ``none``; ``k``: the most tokens
    drafted per request and step. ``budget`` / ``min_prob`` / ``prior`` tune ours (see
    ``DrafterSettings``).

    ``eagle``: a learned draft head served by vLLM's ``eagle`` method (``train/draft_head.py``).
    ``head``: its dir, or ``auto`` (made from the starting policy and warm-trained for
    ``warm_steps`` on the warm start's demonstrations, cached under the model cache);
    ``online``: train it every RL step on that step's trajectories (``rows`` of them, cut to
    ``max_len`` tokens) and publish it with the policy, else it stays frozen after warm-up;
    ``topk``: the policy tokens its Top-K KL loss matches; ``lr``: its AdamW rate."""

    model_config = ConfigDict(extra="forbid")

    method: DraftMethod = "none"
    k: int = Field(default=4, ge=1, le=16)
    budget: int | None = Field(default=None, ge=0)
    min_prob: float | None = Field(default=None, ge=0.0, le=1.0)
    prior: float | None = Field(default=None, ge=0.0)
    head: str = "auto"
    online: bool = True
    topk: int = Field(default=64, ge=1)
    warm_steps: int = Field(default=200, ge=0)
    rows: int = Field(default=4, ge=1)
    max_len: int = Field(default=1024, ge=16)
    lr: float = Field(default=1e-3, gt=0)

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
        if self.method == "eagle":
            if self.head == "auto":
                raise ConfigError("engine.drafting.head is 'auto': a run makes the head before engines start")
            return {"method": "eagle", "model": self.head, "num_speculative_tokens": self.k}
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
