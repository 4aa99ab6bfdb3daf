"""Which whole sequences to leave out of the loss (ROLL's stability lessons).

Unrecoverable failures (the sandbox died, the agent crashed) carry no signal about the
policy; long negative trajectories dominate token-level losses and destabilise training.
Both are removed by zeroing their tokens' mask, so batch shapes stay as they are.
"""

from __future__ import annotations

import torch

from rollyard.core.errors import DataError


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
