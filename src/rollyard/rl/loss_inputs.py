"""Checking, flattening and aggregating the per-token tensors every policy loss takes.

Losses accept flat ``[T]`` tensors (packed sequences, told apart by ``seq_ids``) or padded
``[B, T]`` tensors (one row per sequence). Bad input fails here with a ``DataError`` naming
the tensor, so a loss never turns it into a silent NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

import torch

from rollyard.core.errors import DataError

# exp() of a log-ratio above this overflows float32 soon after; such tokens are far outside
# any clip range anyway.
MAX_LOG_RATIO = 20.0


class Aggregation(StrEnum):
    TOKEN_MEAN = "token-mean"  # every trained token weighs the same
    SEQ_MEAN = "seq-mean"  # mean over sequences of each sequence's token mean
    TOKEN_SUM_NORM = "token-sum-norm"  # token sum divided by a fixed constant (Dr. GRPO style)


@dataclass(frozen=True)
class Flat:
    """Validated inputs, flattened to ``[T]``, with masked-out positions zeroed.

    ``mask`` is what trains; ``norm`` is the mask the normalisers count (the trained tokens
    before any correction or mismatch mask dropped some). A dropped token counts as a
    zero-loss token, so a mask computed from the policy never changes any denominator and the
    loss of a batch is the sum of its parts' losses however the batch is split.
    """

    logprobs: torch.Tensor
    old: torch.Tensor
    adv: torch.Tensor
    mask: torch.Tensor  # float 0/1
    seq: torch.Tensor  # long, dense 0..S-1
    num_seqs: int
    norm: torch.Tensor  # float 0/1, covers mask

    def masked(self, keep: torch.Tensor) -> Flat:
        """The same inputs with the tokens where ``keep`` is False left out; normalisers kept."""
        return replace(self, mask=self.mask * keep.to(self.mask.dtype))

    @property
    def tokens(self) -> int:
        return int(self.mask.sum().item())


def _check_finite(name: str, x: torch.Tensor, mask: torch.Tensor) -> None:
    if not torch.isfinite(x[mask]).all():
        raise DataError(f"{name} has NaN or infinite values at trained positions")


def flatten_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor | None = None,
    norm_mask: torch.Tensor | None = None,
    **extra: torch.Tensor | None,
) -> tuple[Flat, dict[str, torch.Tensor]]:
    """Validate shapes and values; returns the flat view and the flattened ``extra`` tensors.

    ``norm_mask`` (default: ``mask``) is the mask the normalisers count; it must cover ``mask``."""
    named = {"logprobs": logprobs, "old_logprobs": old_logprobs, "advantages": advantages, "mask": mask}
    for name, t in named.items():
        if not isinstance(t, torch.Tensor):
            raise DataError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shape = logprobs.shape
    if logprobs.dim() not in (1, 2):
        raise DataError(f"logprobs must be [T] or [B, T], got shape {tuple(shape)}")
    if logprobs.numel() == 0:
        raise DataError("empty batch: logprobs has no elements")
    if not logprobs.is_floating_point():
        raise DataError("logprobs must be a floating-point tensor")
    present = {k: v for k, v in extra.items() if v is not None}
    for name, t in {**named, **present, **({"seq_ids": seq_ids} if seq_ids is not None else {})}.items():
        if t.shape != shape:
            raise DataError(f"{name} has shape {tuple(t.shape)}, logprobs has {tuple(shape)}")
    if mask.dtype != torch.bool and not ((mask == 0) | (mask == 1)).all():
        raise DataError("mask must be boolean or 0/1")
    m = mask.bool()
    if norm_mask is None:
        norm = m
    elif norm_mask.shape != shape or (m & ~norm_mask.bool()).any():
        raise DataError("norm_mask must have the shape of mask and cover every trained token")
    else:
        norm = norm_mask.bool()
    if seq_ids is None:
        seq_ids = (
            torch.arange(shape[0], device=logprobs.device).unsqueeze(1).expand(shape)
            if logprobs.dim() == 2
            else torch.zeros(shape, dtype=torch.long, device=logprobs.device)
        )
    elif seq_ids.is_floating_point():
        raise DataError("seq_ids must be integers")
    for name, t in {"logprobs": logprobs, "old_logprobs": old_logprobs, "advantages": advantages}.items():
        _check_finite(name, t, m)
    for name, t in present.items():
        if t.is_floating_point():
            _check_finite(name, t, m)
    m = m.reshape(-1)
    seq, inverse = torch.unique(seq_ids.reshape(-1), return_inverse=True)

    def clean(t: torch.Tensor) -> torch.Tensor:
        t = t.reshape(-1)
        return torch.where(m, t, torch.zeros_like(t)) if t.is_floating_point() else t

    flat = Flat(
        logprobs=clean(logprobs),
        old=clean(old_logprobs).detach(),
        adv=clean(advantages).detach(),
        mask=m.to(logprobs.dtype),
        seq=inverse,
        num_seqs=int(seq.numel()),
        norm=norm.reshape(-1).to(logprobs.dtype),
    )
    return flat, {k: clean(v) for k, v in present.items()}


def group_sum(values: torch.Tensor, index: torch.Tensor, n: int) -> torch.Tensor:
    """Sum ``values`` into ``n`` bins by ``index`` (differentiable)."""
    return torch.zeros(n, dtype=values.dtype, device=values.device).index_add(0, index, values)


def aggregate(
    per_token: torch.Tensor,
    flat: Flat,
    aggregation: Aggregation | str,
    norm_const: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss to a scalar over trained tokens, as configured.

    Denominators count ``flat.norm`` (fixed before masking): token-mean divides by its tokens,
    seq-mean averages over its sequences each one's sum divided by its own ``norm`` count."""
    agg = Aggregation(aggregation)
    masked = per_token * flat.mask
    if agg == Aggregation.TOKEN_MEAN:
        return masked.sum() / flat.norm.sum().clamp(min=1.0)
    if agg == Aggregation.TOKEN_SUM_NORM:
        if norm_const is None or not norm_const > 0:
            raise DataError("token-sum-norm aggregation needs norm_const > 0")
        return masked.sum() / norm_const
    sums = group_sum(masked, flat.seq, flat.num_seqs)
    counts = group_sum(flat.norm, flat.seq, flat.num_seqs)
    live = counts > 0
    if not live.any():
        return masked.sum()
    return (sums[live] / counts[live]).mean()


def masked_stats(values: torch.Tensor, flat: Flat) -> dict[str, float]:
    """Mean, min and max of ``values`` over trained tokens (detached)."""
    v = values.detach()[flat.mask.bool()]
    if v.numel() == 0:
        return {"mean": 0.0, "min": 0.0, "max": 0.0}
    return {"mean": float(v.mean()), "min": float(v.min()), "max": float(v.max())}


def masked_mean(values: torch.Tensor, flat: Flat) -> float:
    m = flat.mask
    return float((values.detach() * m).sum() / m.sum().clamp(min=1.0))
