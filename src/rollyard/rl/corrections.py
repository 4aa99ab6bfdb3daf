"""Off-policy corrections: how far the trainer's policy has drifted from the one that sampled.

Every correction looks at the per-token importance ratio rho_t = pi_prox(t) / mu(t), where mu is
the behaviour policy (the logprobs the engine recorded while sampling) and pi_prox the trainer's
policy before the step's update (with one optimizer step per batch: the step's own forward pass,
detached). It returns a per-token weight (detached, multiplies the per-token loss) and a keep mask
(tokens it rejects leave the loss; the loss's normalisers stay those fixed before masking).

``decoupled`` (AReaL's decoupled PPO): the loss's clipped ratio is pi_theta / pi_prox and the
behaviour correction is the weight rho; without it the loss's ratio is pi_theta / mu, which holds
rho already, so only the masks act and the weight kinds (``token_tis``, ``seq_tis``, ``seq_mis``)
are refused. Formulas and sources: docs/training.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

import torch

from rollyard.core.errors import DataError
from rollyard.rl.loss_inputs import MAX_LOG_RATIO, group_sum


class CorrectionKind(StrEnum):
    NONE = "none"
    TOKEN_TIS = "token_tis"  # w_t = min(rho_t, C)
    SEQ_TIS = "seq_tis"  # w_t = min(rho_seq, C), rho_seq = prod_t rho_t
    SEQ_MIS = "seq_mis"  # w_t = rho_seq, the sequence rejected when rho_seq > C
    GEO_MASK = "geo_mask"  # sequence rejected when its geometric-mean ratio is outside [low, high]
    ICEPOP = "icepop"  # token rejected when rho_t is outside [low, high]


WEIGHT_KINDS = frozenset({CorrectionKind.TOKEN_TIS, CorrectionKind.SEQ_TIS, CorrectionKind.SEQ_MIS})
QUANTILES = (0.1, 0.5, 0.9)


@dataclass(frozen=True)
class Correction:
    weight: torch.Tensor  # [T], detached; 1 where nothing is corrected
    keep: torch.Tensor  # [T] bool; False for rejected tokens
    metrics: dict[str, float]


def off_policy_correction(
    kind: CorrectionKind | str,
    log_rho: torch.Tensor,
    mask: torch.Tensor,
    seq: torch.Tensor,
    num_seqs: int,
    *,
    decoupled: bool,
    clip: float = 2.0,
    low: float = 0.5,
    high: float = 5.0,
    forced: torch.Tensor | None = None,
) -> Correction:
    """Weights and keep mask for flat ``[T]`` tensors (``seq``: dense sequence ids, ``mask``: the
    trained tokens). ``clip`` is C for the TIS/MIS kinds; ``low``/``high`` bound rho_t (icepop)
    or the sequence's geometric-mean ratio (geo_mask). ``forced`` tokens (sampled under a
    grammar: mu is not the policy's) count as rho_t = 1: they add nothing to a sequence's ratio
    or its geometric-mean count, are never rejected by ``icepop`` and are left out of the
    metrics; a sequence-level weight or rejection still applies to them."""
    kind = CorrectionKind(kind)
    if not clip > 0 or not 0 <= low < high:
        raise DataError(f"correction needs clip > 0 and 0 <= low < high, got {clip}, {low}, {high}")
    if kind in WEIGHT_KINDS and not decoupled:
        raise DataError(f"correction {kind.value} weights by pi_prox/mu; it needs decoupled: true")
    trained = mask.bool()
    m = trained & ~forced.bool() if forced is not None else trained  # where rho_t is measured
    lr = (log_rho.detach() * m).clamp(max=MAX_LOG_RATIO)
    rho = torch.exp(lr)
    seq_lr = group_sum(lr, seq, num_seqs)  # log prod_t rho_t over the sequence's trained tokens
    counts = group_sum(m.to(lr.dtype), seq, num_seqs)
    seq_rho = torch.exp(seq_lr.clamp(max=MAX_LOG_RATIO))[seq]
    geo = torch.exp(seq_lr / counts.clamp(min=1.0))[seq]
    weight = rho if decoupled else torch.ones_like(rho)
    keep = torch.ones_like(m)
    truncated = torch.zeros_like(m)
    if kind == CorrectionKind.TOKEN_TIS:
        truncated = rho > clip
        weight = rho.clamp(max=clip)
    elif kind == CorrectionKind.SEQ_TIS:
        truncated = seq_rho > clip
        weight = seq_rho.clamp(max=clip)
    elif kind == CorrectionKind.SEQ_MIS:
        keep = seq_rho <= clip
        weight = seq_rho
    elif kind == CorrectionKind.GEO_MASK:
        keep = (geo >= low) & (geo <= high)
    elif kind == CorrectionKind.ICEPOP:
        keep = ((rho >= low) & (rho <= high)) | (trained & ~m)
    n = m.sum().clamp(min=1)
    metrics = {
        "is_masked_frac": float((m & ~keep).sum() / n),
        "is_truncated_frac": float((m & keep & truncated).sum() / n),
        # KL(mu || pi_prox) by the k3 estimator over tokens mu sampled: rho - 1 - log rho >= 0,
        # before any correction acts, so it compares configs (staleness plus train/infer gap)
        "behaviour_kl": float(((rho - 1.0 - lr) * m).sum() / n),
    }
    measured = rho[m].double()
    qs = torch.tensor(QUANTILES, dtype=torch.float64, device=measured.device)
    values = torch.quantile(measured, qs) if measured.numel() else torch.zeros(3)
    metrics.update({f"is_ratio_p{round(q * 100)}": float(v) for q, v in zip(QUANTILES, values, strict=True)})
    if kind not in (CorrectionKind.SEQ_TIS, CorrectionKind.SEQ_MIS):
        weight = torch.where(m, weight, torch.ones_like(weight))  # a forced token's own weight is 1
    weight = torch.where(trained, weight, torch.ones_like(weight)).detach()
    return Correction(weight=weight, keep=keep, metrics=metrics)
