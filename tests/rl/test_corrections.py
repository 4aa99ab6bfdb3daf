"""Each off-policy correction against a plain per-sequence reference written from its formula."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollyard.core import DataError
from rollyard.rl.corrections import CorrectionKind, off_policy_correction

C, LOW, HIGH = 2.0, 0.5, 3.0


def _reference(
    kind: str, seqs: list[list[tuple[float, bool]]], decoupled: bool, forced: list[list[bool]] | None = None
) -> list[tuple[float, bool]]:
    """(weight, keep) per token, straight from docs/training.md's formulas; a forced token counts
    as rho = 1 (its own weight 1, never rejected by itself; its sequence's weight and rejection)."""
    out = []
    for i, tokens in enumerate(seqs):
        flags = forced[i] if forced is not None else [False] * len(tokens)
        trained = [lr for (lr, m), f in zip(tokens, flags, strict=True) if m and not f]
        seq_rho = math.exp(sum(trained))
        geo = math.exp(sum(trained) / len(trained)) if trained else 1.0
        for (lr, m), f in zip(tokens, flags, strict=True):
            rho = 1.0 if f else math.exp(lr)
            w, keep = (rho if decoupled else 1.0), True
            if kind == "token_tis":
                w = min(rho, C) if not f else 1.0
            elif kind == "seq_tis":
                w = min(seq_rho, C)
            elif kind == "seq_mis":
                w, keep = seq_rho, seq_rho <= C
            elif kind == "geo_mask":
                keep = LOW <= geo <= HIGH
            elif kind == "icepop":
                keep = f or LOW <= rho <= HIGH
            out.append((w, keep) if m else (1.0, keep))
    return out


_TOKEN = st.tuples(st.floats(-2.0, 2.0), st.booleans())


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(_TOKEN, min_size=1, max_size=6), min_size=1, max_size=5),
    st.sampled_from(list(CorrectionKind)),
    st.booleans(),
)
def test_every_correction_matches_its_reference(
    seqs: list[list[tuple[float, bool]]], kind: CorrectionKind, decoupled: bool
) -> None:
    decoupled = decoupled or kind in ("token_tis", "seq_tis", "seq_mis")
    log_rho = torch.tensor([lr for s in seqs for lr, _ in s], dtype=torch.float64)
    mask = torch.tensor([m for s in seqs for _, m in s])
    seq = torch.tensor([i for i, s in enumerate(seqs) for _ in s])
    got = off_policy_correction(
        kind, log_rho, mask, seq, len(seqs), decoupled=decoupled, clip=C, low=LOW, high=HIGH
    )
    want = _reference(kind.value, seqs, decoupled)
    trained = [m for s in seqs for _, m in s]
    for i, ((w, keep), m) in enumerate(zip(want, trained, strict=True)):
        assert float(got.weight[i]) == pytest.approx(w, rel=1e-9), i
        if m:
            assert bool(got.keep[i]) == keep, i
    n = max(1, sum(trained))
    masked = sum(1 for (_, k), m in zip(want, trained, strict=True) if m and not k)
    assert got.metrics["is_masked_frac"] == pytest.approx(masked / n)
    rhos = sorted(math.exp(lr) for s in seqs for lr, m in s if m)
    for q in (10, 50, 90):
        assert got.metrics[f"is_ratio_p{q}"] == pytest.approx(_quantile(rhos, q / 100), rel=1e-6)


def _quantile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks; 0 for no values."""
    if not values:
        return 0.0
    pos = q * (len(values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(values) - 1)
    return values[lo] + (values[hi] - values[lo]) * (pos - lo)


def test_truncation_is_counted_and_weights_need_the_decoupled_loss() -> None:
    log_rho = torch.tensor([math.log(3.0), 0.0, math.log(0.2)])
    mask = torch.tensor([True, True, True])
    seq = torch.zeros(3, dtype=torch.long)
    got = off_policy_correction("token_tis", log_rho, mask, seq, 1, decoupled=True, clip=C)
    assert got.weight.tolist() == pytest.approx([2.0, 1.0, 0.2])
    assert got.metrics["is_truncated_frac"] == pytest.approx(1 / 3)
    # KL(mu || pi_prox) by k3 over the sampled tokens: mean of rho - 1 - log rho
    assert got.metrics["behaviour_kl"] == pytest.approx(sum(r - 1 - math.log(r) for r in (3.0, 1.0, 0.2)) / 3)
    forced = torch.tensor([False, False, True])  # a forced token's ratio is not measured
    got = off_policy_correction("none", log_rho, mask, seq, 1, decoupled=False, forced=forced)
    assert got.metrics["behaviour_kl"] == pytest.approx((2.0 - math.log(3.0)) / 2)
    with pytest.raises(DataError, match="decoupled"):
        off_policy_correction("seq_tis", log_rho, mask, seq, 1, decoupled=False)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.floats(-2.0, 2.0), st.booleans(), st.booleans()), min_size=1, max_size=6),
        min_size=1,
        max_size=5,
    ),
    st.sampled_from(list(CorrectionKind)),
    st.booleans(),
)
def test_forced_tokens_count_as_rho_one_and_are_left_out_of_the_metrics(
    seqs3: list[list[tuple[float, bool, bool]]], kind: CorrectionKind, decoupled: bool
) -> None:
    decoupled = decoupled or kind in ("token_tis", "seq_tis", "seq_mis")
    seqs = [[(lr, m) for lr, m, _ in s] for s in seqs3]
    flags = [[f for _, _, f in s] for s in seqs3]
    log_rho = torch.tensor([lr for s in seqs for lr, _ in s], dtype=torch.float64)
    mask = torch.tensor([m for s in seqs for _, m in s])
    forced = torch.tensor([f for fs in flags for f in fs])
    seq = torch.tensor([i for i, s in enumerate(seqs) for _ in s])
    got = off_policy_correction(
        kind, log_rho, mask, seq, len(seqs), decoupled=decoupled, clip=C, low=LOW, high=HIGH, forced=forced
    )
    want = _reference(kind.value, seqs, decoupled, flags)
    trained = mask.tolist()
    for i, ((w, keep), m) in enumerate(zip(want, trained, strict=True)):
        assert float(got.weight[i]) == pytest.approx(w, rel=1e-9), i
        if m:
            assert bool(got.keep[i]) == keep, i
    measured = [m and not f for m, f in zip(trained, forced.tolist(), strict=True)]
    n = max(1, sum(measured))
    masked = sum(1 for (_, k), m in zip(want, measured, strict=True) if m and not k)
    assert got.metrics["is_masked_frac"] == pytest.approx(masked / n)
    rhos = sorted(math.exp(lr) for lr, m in zip(log_rho.tolist(), measured, strict=True) if m)
    for q in (10, 50, 90):
        assert got.metrics[f"is_ratio_p{q}"] == pytest.approx(_quantile(rhos, q / 100), rel=1e-6)
