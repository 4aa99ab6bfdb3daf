"""Which whole sequences to leave out of the loss (ROLL's stability lessons).

Unrecoverable failures (the sandbox died, the agent crashed) carry no signal about the
policy; long negative trajectories dominate token-level losses and destabilise training.
Both are removed by zeroing their tokens' mask, so batch shapes stay as they are.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import DataError
from rollyard.core.sample import Sample


def sequence_keep(
    lengths: torch.Tensor,
    advantages: torch.Tensor,
    *,
    failed: torch.Tensor | None = None,
    max_negative_tokens: int | None = None,
    positive_only: bool = False,
) -> torch.Tensor:
    """Per-sequence bool: False for failed ones, negative ones longer than the bound, and
    (with ``positive_only``) every sequence whose advantage is not positive."""
    if lengths.dim() != 1 or advantages.shape != lengths.shape:
        raise DataError(
            f"lengths {tuple(lengths.shape)} and advantages {tuple(advantages.shape)} must be [S]"
        )
    if not torch.isfinite(advantages).all():
        raise DataError("sequence advantages must be finite")
    keep = torch.ones_like(lengths, dtype=torch.bool)
    if failed is not None:
        if failed.shape != lengths.shape:
            raise DataError(f"failed has shape {tuple(failed.shape)}, lengths {tuple(lengths.shape)}")
        keep &= ~failed.bool()
    if max_negative_tokens is not None:
        if max_negative_tokens < 0:
            raise DataError("max_negative_tokens must be >= 0")
        keep &= ~((advantages < 0) & (lengths > max_negative_tokens))
    if positive_only:
        keep &= advantages > 0
    return keep


def mask_sequences(mask: torch.Tensor, seq_ids: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Zero the mask of every token whose sequence is not kept; ``seq_ids`` index ``keep``."""
    if mask.shape != seq_ids.shape:
        raise DataError(f"mask {tuple(mask.shape)} and seq_ids {tuple(seq_ids.shape)} differ in shape")
    if seq_ids.numel() and (seq_ids.min() < 0 or seq_ids.max() >= keep.numel()):
        raise DataError(f"seq_ids must lie in [0, {keep.numel()})")
    kept = keep.bool()[seq_ids.long()]
    return mask.bool() & kept if mask.dtype == torch.bool else mask * kept.to(mask.dtype)


class StabilityMasks(BaseModel):
    """Trainer options: which whole samples to leave out of the loss (``trainer.masks``)."""

    model_config = ConfigDict(extra="forbid")

    unrecoverable: bool = False  # the sandbox or the engine failed under the program
    max_negative_tokens: int | None = Field(default=None, ge=0)  # e.g. 20000 (ROLL)
    positive_only: bool = False  # positive-only RL first

    @property
    def active(self) -> bool:
        return self.unrecoverable or self.max_negative_tokens is not None or self.positive_only


def apply_masks(samples: Sequence[Sample], failed: Sequence[bool], masks: StabilityMasks) -> list[Sample]:
    """The samples with the loss mask of each left-out one zeroed (shapes unchanged); ``failed``
    says per sample whether its program ended in an unrecoverable failure."""
    if len(failed) != len(samples):
        raise DataError(f"{len(samples)} samples but {len(failed)} failure flags")
    if not samples or not masks.active:
        return list(samples)
    lengths = torch.tensor([len(s.token_ids) for s in samples])
    adv = torch.tensor([_mean_advantage(s) for s in samples], dtype=torch.float64)
    keep = sequence_keep(
        lengths,
        adv,
        failed=torch.tensor(list(failed)) if masks.unrecoverable else None,
        max_negative_tokens=masks.max_negative_tokens,
        positive_only=masks.positive_only,
    )
    return [
        s if k else s.model_copy(update={"loss_mask": [0] * len(s.loss_mask)})
        for s, k in zip(samples, keep.tolist(), strict=True)
    ]


def _mean_advantage(s: Sample) -> float:
    trained = [a for a, m in zip(s.advantages, s.loss_mask, strict=True) if m]
    return sum(trained) / len(trained) if trained else 0.0
