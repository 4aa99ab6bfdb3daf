"""Policy-gradient losses over per-token tensors: PPO-clip, GSPO, IPA chunk-level and CISPO.

Every loss takes new logprobs (with grad), old/behaviour logprobs, advantages and a mask,
all ``[T]`` (with ``seq_ids``) or ``[B, T]``, and optionally ``token_weights`` (detached
per-token multipliers of the policy term: an off-policy correction's weights) and ``norm_mask``
(the mask the normalisers count, default ``mask``: see ``loss_inputs.Flat``); it returns
``(loss, metrics)`` where metrics
holds plain floats: ``clip_frac``, ``approx_kl`` (k3 estimate of KL(old || new)), ratio
mean/min/max, ``tokens`` and, with a reference, ``kl_ref``. A batch with no trained token
returns a zero loss still attached to the graph and ``tokens == 0``.
"""

from __future__ import annotations

import torch

from rollyard.core.errors import DataError, TrainError
from rollyard.rl.loss_inputs import (
    MAX_LOG_RATIO,
    Aggregation,
    Flat,
    aggregate,
    flatten_inputs,
    group_sum,
    masked_mean,
    masked_stats,
)

Metrics = dict[str, float]


def _check_clip(low: float | None, high: float | None) -> None:
    for name, v in (("clip_low", low), ("clip_high", high)):
        if v is not None and not v >= 0:
            raise DataError(f"{name} must be >= 0, got {v}")


def _clipped_surrogate(
    ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO surrogate loss and where the clipped branch is the one in force."""
    clipped = ratio.clamp(1.0 - low, 1.0 + high)
    loss = -torch.minimum(ratio * adv, clipped * adv)
    active = ((adv > 0) & (ratio > 1.0 + high)) | ((adv < 0) & (ratio < 1.0 - low))
    return loss, active


def _finish(
    per_token: torch.Tensor,
    flat: Flat,
    log_ratio: torch.Tensor,
    active: torch.Tensor,
    aggregation: Aggregation | str,
    norm_const: float | None,
    extra: dict[str, torch.Tensor],
    kl_coef: float,
) -> tuple[torch.Tensor, Metrics]:
    """Weight, aggregate, add the reference KL, and gather the metrics every loss reports."""
    if kl_coef < 0:
        raise DataError(f"kl_coef must be >= 0, got {kl_coef}")
    ref = extra.get("ref")
    if "weights" in extra:
        per_token = per_token * extra["weights"].detach()
    pg = aggregate(per_token, flat, aggregation, norm_const)
    loss = pg
    ratio = torch.exp(log_ratio.detach())
    metrics: Metrics = {
        "tokens": float(flat.tokens),
        "loss_pg": float(pg.detach()),
        "clip_frac": masked_mean(active.to(flat.mask.dtype), flat),
        "approx_kl": masked_mean(ratio - 1.0 - log_ratio.detach(), flat),
    }
    metrics.update({f"ratio_{k}": v for k, v in masked_stats(ratio, flat).items()})
    if ref is not None:
        delta = (ref - flat.logprobs).clamp(max=MAX_LOG_RATIO)
        kl = torch.exp(delta) - delta - 1.0  # k3: unbiased, always >= 0
        kl_term = aggregate(kl, flat, aggregation, norm_const)
        metrics["kl_ref"] = float(kl_term.detach())
        if kl_coef:
            loss = loss + kl_coef * kl_term
    if flat.tokens == 0:
        loss = flat.logprobs.sum() * 0.0  # nothing to learn; keep the graph so backward() works
    if not torch.isfinite(loss):
        raise TrainError(f"loss is not finite ({float(loss)}); check logprob magnitudes")
    metrics["loss"] = float(loss.detach())
    return loss, metrics


def ppo_clip_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    seq_ids: torch.Tensor | None = None,
    aggregation: Aggregation | str = Aggregation.TOKEN_MEAN,
    norm_const: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    norm_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Token-level PPO-clip (GRPO): ratio per token, clipped to [1-low, 1+high]."""
    _check_clip(clip_low, clip_high)
    flat, extra = flatten_inputs(
        logprobs, old_logprobs, advantages, mask, seq_ids, norm_mask, ref=ref_logprobs, weights=token_weights
    )
    log_ratio = (flat.logprobs - flat.old).clamp(max=MAX_LOG_RATIO)
    per_token, active = _clipped_surrogate(torch.exp(log_ratio), flat.adv, clip_low, clip_high)
    return _finish(per_token, flat, log_ratio, active, aggregation, norm_const, extra, kl_coef)


def _grouped_ratio(flat: Flat, group: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ratio whose value is its group's geometric-mean ratio.

    s_t = sg[s_g] * p(y_t) / sg[p(y_t)]: the value is s_g and d s_t / d logp_t = s_g, so a
    group mean of per-token terms has exactly the gradient of the group-level objective.
    Returns (per-token ratio, per-token group log-ratio).
    """
    log_ratio = flat.logprobs - flat.old
    counts = group_sum(flat.mask, group, n).clamp(min=1.0)
    group_lr = (group_sum(log_ratio.detach() * flat.mask, group, n) / counts).clamp(max=MAX_LOG_RATIO)
    token_group_lr = group_lr[group]
    ratio = torch.exp(token_group_lr + flat.logprobs - flat.logprobs.detach())
    return ratio, token_group_lr


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    seq_ids: torch.Tensor | None = None,
    aggregation: Aggregation | str = Aggregation.SEQ_MEAN,
    norm_const: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    norm_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Sequence-level GSPO: one geometric-mean ratio per sequence, clipped, times advantage.

    Uses the token form of GSPO, so per-token advantages are allowed; with the default
    ``seq-mean`` aggregation and a constant advantage per sequence it equals sequence GSPO.
    """
    _check_clip(clip_low, clip_high)
    flat, extra = flatten_inputs(
        logprobs, old_logprobs, advantages, mask, seq_ids, norm_mask, ref=ref_logprobs, weights=token_weights
    )
    ratio, log_ratio = _grouped_ratio(flat, flat.seq, flat.num_seqs)
    per_token, active = _clipped_surrogate(ratio, flat.adv, clip_low, clip_high)
    return _finish(per_token, flat, log_ratio, active, aggregation, norm_const, extra, kl_coef)


def ipa_chunk_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    chunk_ids: torch.Tensor,
    *,
    infer_logprobs: torch.Tensor | None = None,
    mismatch_bound: float | None = None,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    seq_ids: torch.Tensor | None = None,
    aggregation: Aggregation | str = Aggregation.SEQ_MEAN,
    norm_const: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    norm_mask: torch.Tensor | None = None,
    forced: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """Chunk-level IPA: a geometric-mean ratio per (sequence, chunk).

    With ``infer_logprobs``, each chunk's train/inference mismatch |mean(old - infer)| is
    measured (``old``: the trainer's logprobs of the behaviour tokens) and reported
    (``mismatch_mean``, ``mismatch_p90``, ``mismatch_max`` over chunks); with ``mismatch_bound``
    too, a chunk whose mismatch exceeds it is masked out entirely (``chunk_mask_frac``).
    ``forced`` tokens (sampled under a grammar, their recorded logprob not the policy's) are
    left out of the mismatch: a chunk of forced tokens only is never masked by it.
    """
    _check_clip(clip_low, clip_high)
    if mismatch_bound is not None and (infer_logprobs is None or not mismatch_bound >= 0):
        raise DataError("mismatch_bound needs infer_logprobs and a bound >= 0")
    flat, extra = flatten_inputs(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        seq_ids,
        norm_mask,
        chunks=chunk_ids,
        infer=infer_logprobs,
        ref=ref_logprobs,
        weights=token_weights,
        forced=forced,
    )
    chunks = extra["chunks"]
    if chunks.is_floating_point():
        raise DataError("chunk_ids must be integers")
    if (chunks[flat.mask.bool()] < 0).any():
        raise DataError("a trained token has chunk id < 0; every trained token needs a chunk")
    width = int(chunks.max().clamp(min=0)) + 1
    _, group = torch.unique(flat.seq * width + chunks.clamp(min=0), return_inverse=True)
    n = int(group.max()) + 1
    live_chunks = int((group_sum(flat.mask, group, n) > 0).sum())
    mismatch: Metrics = {}
    if "infer" in extra:
        measured = flat.mask * (1.0 - extra["forced"].to(flat.mask.dtype)) if "forced" in extra else flat.mask
        gap = group_sum((flat.old - extra["infer"]) * measured, group, n)
        counts = group_sum(measured, group, n)
        live = counts > 0
        per_chunk = (gap.abs() / counts.clamp(min=1.0))[live].detach()
        if per_chunk.numel():
            mismatch = {
                "mismatch_mean": float(per_chunk.mean()),
                "mismatch_p90": float(torch.quantile(per_chunk.float(), 0.9)),
                "mismatch_max": float(per_chunk.max()),
            }
        if mismatch_bound is not None:
            bad = (gap.abs() / counts.clamp(min=1.0) > mismatch_bound) & live
            mismatch["chunk_mask_frac"] = float(bad.sum()) / max(1, int(live.sum()))
            flat = flat.masked(~bad[group])  # normalisers unchanged: see loss_inputs.Flat
    ratio, log_ratio = _grouped_ratio(flat, group, n)
    per_token, active = _clipped_surrogate(ratio, flat.adv, clip_low, clip_high)
    loss, metrics = _finish(per_token, flat, log_ratio, active, aggregation, norm_const, extra, kl_coef)
    metrics["chunks"] = float(live_chunks)
    metrics["chunk_mask_frac"] = 0.0
    metrics.update(mismatch)
    return loss, metrics


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float = 0.2,
    seq_ids: torch.Tensor | None = None,
    aggregation: Aggregation | str = Aggregation.TOKEN_MEAN,
    norm_const: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    token_weights: torch.Tensor | None = None,
    norm_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, Metrics]:
    """CISPO: -sg[clip(ratio)] * A * logp. Every token keeps a gradient; only its weight is capped.

    ``clip_low=None`` leaves the weight unbounded below (it is >= 0 anyway).
    """
    _check_clip(clip_low, clip_high)
    flat, extra = flatten_inputs(
        logprobs, old_logprobs, advantages, mask, seq_ids, norm_mask, ref=ref_logprobs, weights=token_weights
    )
    log_ratio = (flat.logprobs - flat.old).clamp(max=MAX_LOG_RATIO)
    ratio = torch.exp(log_ratio.detach())
    lo = 0.0 if clip_low is None else 1.0 - clip_low
    weight = ratio.clamp(min=lo, max=1.0 + clip_high)
    per_token = -(weight * flat.adv * flat.logprobs)
    active = (ratio > 1.0 + clip_high) | (ratio < lo)
    return _finish(per_token, flat, log_ratio, active, aggregation, norm_const, extra, kl_coef)
