"""The training objective per micro-batch: rollyard.rl's policy losses, or cross-entropy for SFT.

A batch is split into micro-batches by token budget, so each micro-batch's loss is weighted by
its share of the batch (trained tokens for token-mean, live sequences for seq-mean) and the sum
over micro-batches (and over data-parallel ranks) equals the loss of the whole batch at once.
Shares count the samples' loss masks as recorded, fixed before the step; a token that a mask
computed during the step drops (IPA's mismatch mask, an off-policy correction) counts as a
zero-loss token, so no such mask can make the result depend on the split.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from rollyard.core.errors import ConfigError
from rollyard.core.sample import Sample
from rollyard.rl import losses
from rollyard.rl.corrections import WEIGHT_KINDS, CorrectionKind, off_policy_correction
from rollyard.rl.loss_inputs import Aggregation

LossKind = Literal["ppo", "gspo", "ipa", "cispo", "sft"]

_LOSSES: dict[str, Callable[..., tuple[torch.Tensor, dict[str, float]]]] = {
    "ppo": losses.ppo_clip_loss,
    "gspo": losses.gspo_loss,
    "ipa": losses.ipa_chunk_loss,
    "cispo": losses.cispo_loss,
}
_DEFAULT_AGG = {"ppo": "token-mean", "gspo": "seq-mean", "ipa": "seq-mean", "cispo": "token-mean"}


class LossConfig(BaseModel):
    """Which loss, its aggregation, and keyword overrides passed to the rl loss (clip_low, ...)."""

    model_config = ConfigDict(extra="forbid")

    kind: LossKind = "ppo"
    aggregation: str | None = None  # None: the loss's own default
    options: dict[str, float] = Field(default_factory=dict)

    def resolved_aggregation(self) -> Aggregation:
        if self.kind == "sft":
            return Aggregation.TOKEN_MEAN
        try:
            return Aggregation(self.aggregation or _DEFAULT_AGG[self.kind])
        except ValueError as e:
            raise ConfigError(f"unknown aggregation {self.aggregation!r}") from e


# Default bounds on rho_t (icepop: IcePop's alpha, beta) or the geometric-mean ratio (geo_mask).
_DEFAULT_BOUNDS = {CorrectionKind.ICEPOP: (0.5, 5.0), CorrectionKind.GEO_MASK: (0.9, 1.1)}


class CorrectionConfig(BaseModel):
    """``trainer.correction``: the off-policy correction (rollyard.rl.corrections, docs/training.md).

    ``clip`` is C of the TIS/MIS kinds; ``low``/``high`` bound rho_t (icepop) or the sequence's
    geometric-mean ratio (geo_mask), defaulting to (0.5, 5) and (0.9, 1.1)."""

    model_config = ConfigDict(extra="forbid")

    kind: CorrectionKind = CorrectionKind.NONE
    clip: float = Field(default=2.0, gt=0)
    low: float | None = Field(default=None, ge=0)
    high: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _bounds_ordered(self) -> CorrectionConfig:
        low, high = self.bounds()
        if not low < high:
            raise ValueError(f"correction needs low < high, got {low}, {high}")
        return self

    def bounds(self) -> tuple[float, float]:
        low, high = _DEFAULT_BOUNDS.get(self.kind, (0.5, 5.0))
        return (low if self.low is None else self.low, high if self.high is None else self.high)

    def check(self, decoupled: bool) -> None:
        """The weight kinds multiply by pi_prox/mu, which only the decoupled loss leaves out of its ratio."""
        if self.kind in WEIGHT_KINDS and not decoupled:
            raise ConfigError(f"trainer.correction.kind {self.kind.value} needs trainer.decoupled: true")


@dataclass(frozen=True)
class BatchTotals:
    """Normalisers of the whole (global) batch, so micro-batch losses add up to the batch loss."""

    tokens: int  # trained tokens
    live_samples: int  # samples with at least one trained token

    @staticmethod
    def of(samples: Sequence[Sample]) -> BatchTotals:
        return BatchTotals(
            tokens=sum(s.num_loss_tokens for s in samples),
            live_samples=sum(1 for s in samples if s.num_loss_tokens > 0),
        )


def _weight(agg: Aggregation, samples: Sequence[Sample], totals: BatchTotals) -> float:
    if agg == Aggregation.TOKEN_MEAN:
        return sum(s.num_loss_tokens for s in samples) / max(totals.tokens, 1)
    if agg == Aggregation.SEQ_MEAN:
        return sum(1 for s in samples if s.num_loss_tokens > 0) / max(totals.live_samples, 1)
    return 1.0


def micro_batch_loss(
    config: LossConfig,
    logprobs: Sequence[torch.Tensor],
    samples: Sequence[Sample],
    totals: BatchTotals,
    correction: CorrectionConfig | None = None,
    decoupled: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Weighted loss of one micro-batch's samples, given their per-token logprobs (t=0 entry unused).

    The behaviour policy mu is the recorded logprobs; the proximal one is ``logprobs`` detached
    (this forward pass runs before the step's single optimizer update). ``decoupled``: the loss's
    ratio is against the proximal policy and the correction weights by pi_prox / mu; otherwise the
    ratio is against mu and the correction only masks (IPA's ratio is against the proximal policy
    either way, its mismatch mask measuring mu)."""
    device = logprobs[0].device
    lp = torch.cat(list(logprobs))
    mask = torch.cat([torch.tensor(s.loss_mask, dtype=lp.dtype) for s in samples]).to(device)
    agg = config.resolved_aggregation()
    weight = _weight(agg, samples, totals)
    if config.kind == "sft":
        n = mask.sum().clamp(min=1.0)
        loss = -(lp * mask).sum() / n
        return loss * weight, {"loss": float(loss.detach()), "tokens": float(mask.sum())}
    old = torch.cat([torch.tensor(s.logprobs, dtype=lp.dtype) for s in samples]).to(device)
    adv = torch.cat([torch.tensor(s.advantages, dtype=lp.dtype) for s in samples]).to(device)
    seq = torch.cat([torch.full((len(s.token_ids),), i, dtype=torch.long) for i, s in enumerate(samples)])
    kwargs: dict[str, Any] = dict(config.options)
    kwargs["seq_ids"] = seq.to(device)
    kwargs["aggregation"] = agg
    correction = correction or CorrectionConfig()
    correction.check(decoupled)
    prox = lp.detach()
    forced: torch.Tensor | None = None
    if any(s.forced is not None for s in samples):
        # A grammar-forced token's recorded logprob is the constrained distribution's: no ratio
        # is taken against it; the proximal policy stands in as its behaviour (docs/training.md).
        forced = torch.cat([torch.tensor(s.forced or [0] * len(s.token_ids)) for s in samples]).bool()
        forced = forced.to(device)
        old = torch.where(forced, prox, old)
    low, high = correction.bounds()
    fix = off_policy_correction(
        correction.kind,
        prox - old,
        mask,
        kwargs["seq_ids"],
        len(samples),
        decoupled=decoupled,
        clip=correction.clip,
        low=low,
        high=high,
        forced=forced,
    )
    kwargs["token_weights"] = fix.weight
    kwargs["norm_mask"] = mask
    trained = mask * fix.keep.to(mask.dtype)
    if config.kind == "ipa":
        if any(s.chunk_ids is None for s in samples):
            raise ConfigError("the ipa loss needs chunk_ids on every sample")
        chunks = torch.cat([torch.tensor(s.chunk_ids, dtype=torch.long) for s in samples])  # type: ignore[arg-type]
        # Train side: the trainer's own logprobs of the behaviour tokens (this forward pass, before
        # the step); inference side: what the engine recorded. Their per-chunk gap is measured,
        # and masked beyond ``options.mismatch_bound``.
        loss, metrics = losses.ipa_chunk_loss(
            lp, prox, adv, trained, chunks.to(device), infer_logprobs=old, forced=forced, **kwargs
        )
    else:
        loss, metrics = _LOSSES[config.kind](lp, prox if decoupled else old, adv, trained, **kwargs)
    metrics.update(fix.metrics)
    n = mask.sum().clamp(min=1.0)
    metrics["forced_frac"] = float((mask.bool() & forced).sum() / n) if forced is not None else 0.0
    return loss * weight, metrics
