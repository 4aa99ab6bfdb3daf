"""Policy losses: hand-computed cases, equivalences between levels, gradients, bad input."""

from __future__ import annotations

import math

import pytest
import torch

from rollyard.core import DataError
from rollyard.rl.losses import cispo_loss, gspo_loss, ipa_chunk_loss, ppo_clip_loss

DT = torch.float64


def t(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=DT)


def leaf(*xs: float) -> torch.Tensor:
    return torch.tensor(xs, dtype=DT, requires_grad=True)


def ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bool)


def test_ppo_clip_matches_a_hand_computed_case() -> None:
    ratios = [1.5, 0.5, 0.5, 1.5]
    old = t(-1.0, -1.0, -1.0, -1.0)
    logp = leaf(*[math.log(r) - 1.0 for r in ratios])
    adv = t(1.0, 1.0, -1.0, -1.0)
    loss, m = ppo_clip_loss(logp, old, adv, ones(4), clip_low=0.2, clip_high=0.2)
    # per token: -min(rA, clip(r)A) = -1.2, -0.5, 0.8, 1.5
    assert loss.item() == pytest.approx((-1.2 - 0.5 + 0.8 + 1.5) / 4)
    assert m["clip_frac"] == pytest.approx(0.5)
    assert m["ratio_max"] == pytest.approx(1.5) and m["ratio_min"] == pytest.approx(0.5)
    loss.backward()
    # clipped tokens get no gradient; the others get -A * r / 4
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([0.0, -0.5 / 4, 0.0, 1.5 / 4])


def test_asymmetric_clip_uses_clip_high_for_positive_advantages() -> None:
    old = t(0.0, 0.0)
    logp = leaf(math.log(1.25), math.log(1.25))
    loss, m = ppo_clip_loss(logp, old, t(1.0, 1.0), ones(2), clip_low=0.2, clip_high=0.28)
    assert loss.item() == pytest.approx(-1.25) and m["clip_frac"] == 0.0


def test_aggregations_weigh_tokens_and_sequences_as_documented() -> None:
    # two sequences, 1 and 3 trained tokens, on-policy so per-token loss = -A
    logp = t(-1.0, -1.0, -1.0, -1.0)
    adv = t(4.0, 1.0, 2.0, 3.0)
    seq = torch.tensor([0, 1, 1, 1])
    kw = {"seq_ids": seq, "clip_low": 0.2, "clip_high": 0.2}
    tok, _ = ppo_clip_loss(logp, logp, adv, ones(4), aggregation="token-mean", **kw)
    seqm, _ = ppo_clip_loss(logp, logp, adv, ones(4), aggregation="seq-mean", **kw)
    norm, _ = ppo_clip_loss(logp, logp, adv, ones(4), aggregation="token-sum-norm", norm_const=5.0, **kw)
    assert tok.item() == pytest.approx(-10 / 4)
    assert seqm.item() == pytest.approx(-(4.0 + 2.0) / 2)
    assert norm.item() == pytest.approx(-10 / 5)


def test_padded_rows_are_sequences_and_masked_padding_is_ignored() -> None:
    logp = torch.tensor([[-1.0, -1.0, 0.0], [-1.0, float("nan"), 0.0]], dtype=DT)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([[1.0, 1.0, 0.0], [3.0, 0.0, 0.0]], dtype=DT)
    loss, m = ppo_clip_loss(logp, logp, adv, mask, aggregation="seq-mean")
    assert loss.item() == pytest.approx(-(1.0 + 3.0) / 2) and m["tokens"] == 3


def test_k3_reference_kl_is_added_with_its_coefficient() -> None:
    logp = t(-1.0)
    ref = t(-2.0)
    loss0, m0 = ppo_clip_loss(logp, logp, t(0.0), ones(1), ref_logprobs=ref)
    loss1, _ = ppo_clip_loss(logp, logp, t(0.0), ones(1), ref_logprobs=ref, kl_coef=0.5)
    expected_kl = math.exp(-1.0) + 1.0 - 1.0
    assert m0["kl_ref"] == pytest.approx(expected_kl) and loss0.item() == pytest.approx(0.0)
    assert loss1.item() == pytest.approx(0.5 * expected_kl)


def test_gspo_uses_the_geometric_mean_ratio_per_sequence() -> None:
    old = t(0.0, 0.0, 0.0, 0.0)
    logp = leaf(0.1, 0.3, -0.05, 0.05)
    seq = torch.tensor([0, 0, 1, 1])
    loss, m = gspo_loss(logp, old, t(1.0, 1.0, -1.0, -1.0), ones(4), seq_ids=seq, clip_low=0.1, clip_high=0.1)
    # seq 0: s = exp(0.2) = 1.221 > 1.1, clipped -> -1.1; seq 1: s = 1 -> +1
    assert loss.item() == pytest.approx((-1.1 + 1.0) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    # seq 0 clipped: no gradient; seq 1: d/dlogp_t of (1/2)*(s * 1) with s = exp(mean) -> s / 2 / 2
    assert logp.grad.tolist() == pytest.approx([0.0, 0.0, 0.25, 0.25])


def test_gspo_with_one_token_sequences_equals_token_level_ppo() -> None:
    g = torch.Generator().manual_seed(0)
    old = -torch.rand(12, generator=g, dtype=DT)
    base = old + 0.4 * (torch.rand(12, generator=g, dtype=DT) - 0.5)
    adv = torch.randn(12, generator=g, dtype=DT)
    mask = torch.rand(12, generator=g) > 0.2
    seq = torch.arange(12)
    grads = []
    for fn in (ppo_clip_loss, gspo_loss):
        logp = base.clone().requires_grad_(True)
        loss, _ = fn(
            logp, old, adv, mask, seq_ids=seq, clip_low=0.1, clip_high=0.15, aggregation="token-mean"
        )
        loss.backward()
        grads.append((loss.detach(), logp.grad))
    assert torch.allclose(grads[0][0], grads[1][0]) and torch.allclose(grads[0][1], grads[1][1])


def test_chunk_level_with_one_chunk_equals_sequence_level() -> None:
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(10, generator=g, dtype=DT)
    base = old + 0.01 * torch.randn(10, generator=g, dtype=DT)
    seq = torch.tensor([0, 0, 0, 0, 1, 1, 1, 2, 2, 2])
    adv = torch.tensor([1.0] * 4 + [-0.5] * 3 + [2.0] * 3, dtype=DT)
    mask = torch.tensor([0, 1, 1, 1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    out = []
    for chunked in (False, True):
        logp = base.clone().requires_grad_(True)
        if chunked:
            loss, _ = ipa_chunk_loss(logp, old, adv, mask, torch.zeros(10, dtype=torch.long), seq_ids=seq)
        else:
            loss, _ = gspo_loss(logp, old, adv, mask, seq_ids=seq)
        loss.backward()
        out.append((loss.detach(), logp.grad))
    assert torch.allclose(out[0][0], out[1][0]) and torch.allclose(out[0][1], out[1][1])


def test_ipa_ratio_is_per_chunk_and_mismatched_chunks_are_masked() -> None:
    old = t(0.0, 0.0, 0.0, 0.0)
    logp = t(0.2, 0.0, 0.4, -1.0)
    chunks = torch.tensor([0, 0, 1, 1])
    mask = torch.tensor([1, 1, 1, 0], dtype=torch.bool)
    loss, m = ipa_chunk_loss(logp, old, t(1.0, 1.0, 1.0, 1.0), mask, chunks, clip_low=1.0, clip_high=1.0)
    # one sequence, chunk ratios exp(0.1) (2 tokens) and exp(0.4) (1 token); seq-mean over 3 tokens
    assert loss.item() == pytest.approx(-(2 * math.exp(0.1) + math.exp(0.4)) / 3)
    assert m["chunks"] == 2
    infer = t(0.0, 0.0, -0.5, 0.0)  # chunk 1 was sampled with a 0.5 logprob gap
    masked, mm = ipa_chunk_loss(
        logp,
        old,
        t(1.0, 1.0, 1.0, 1.0),
        mask,
        chunks,
        infer_logprobs=infer,
        mismatch_bound=0.3,
        clip_low=1.0,
        clip_high=1.0,
    )
    # the masked chunk's token counts as a zero-loss token: the sequence's mean stays over its 3
    # trained tokens, so how the batch is split cannot change the weight of what is left
    assert masked.item() == pytest.approx(-2 * math.exp(0.1) / 3) and mm["chunk_mask_frac"] == pytest.approx(
        0.5
    )


def test_cispo_keeps_gradient_through_clipped_tokens_with_a_capped_weight() -> None:
    old = t(0.0, 0.0)
    logp = leaf(math.log(1.5), math.log(0.9))
    loss, m = cispo_loss(logp, old, t(2.0, 2.0), ones(2), clip_high=0.2)
    assert loss.item() == pytest.approx(-(1.2 * 2.0 * math.log(1.5) + 0.9 * 2.0 * math.log(0.9)) / 2)
    assert m["clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad is not None
    assert logp.grad.tolist() == pytest.approx([-1.2 * 2.0 / 2, -0.9 * 2.0 / 2])


@pytest.mark.parametrize("name", ["ppo", "gspo", "ipa", "cispo"])
def test_on_policy_gradient_equals_the_reinforce_gradient(name: str) -> None:
    g = torch.Generator().manual_seed(2)
    base = -torch.rand(9, generator=g, dtype=DT) - 0.1
    seq = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    adv = torch.tensor([0.5] * 3 + [-1.0] * 3 + [2.0] * 3, dtype=DT)
    mask = torch.tensor([0, 1, 1, 0, 1, 1, 0, 1, 1], dtype=torch.bool)
    chunks = torch.tensor([0, 0, 1, 0, 0, 0, 0, 1, 1])
    agg = "token-mean" if name in ("ppo", "cispo") else "seq-mean"
    logp = base.clone().requires_grad_(True)
    kw = {"seq_ids": seq, "aggregation": agg}
    if name == "ppo":
        loss, m = ppo_clip_loss(logp, logp.detach(), adv, mask, **kw)
    elif name == "gspo":
        loss, m = gspo_loss(logp, logp.detach(), adv, mask, **kw)
    elif name == "ipa":
        loss, m = ipa_chunk_loss(logp, logp.detach(), adv, mask, chunks, **kw)
    else:
        loss, m = cispo_loss(logp, logp.detach(), adv, mask, **kw)
    loss.backward()
    ref = base.clone().requires_grad_(True)
    mf = mask.to(DT)
    if agg == "token-mean":
        reinforce = -(adv * ref * mf).sum() / mf.sum()
    else:
        per_seq = [-(adv * ref * mf)[seq == s].sum() / mf[seq == s].sum() for s in range(3)]
        reinforce = torch.stack(per_seq).mean()
    reinforce.backward()
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac"] == 0.0 and m["approx_kl"] == 0.0
    assert logp.grad is not None and ref.grad is not None
    assert torch.allclose(logp.grad, ref.grad)


@pytest.mark.parametrize("name", ["ppo", "gspo", "ipa"])
def test_losses_pass_gradcheck_in_double_precision(name: str) -> None:
    """The loss value's numerical gradient matches autograd. (CISPO's weight is detached by
    design, so its gradient is not that of its value; its hand case covers it.) The advantage
    is constant per sequence, where GSPO's token form equals its sequence form."""
    g = torch.Generator().manual_seed(3)
    old = -torch.rand(8, generator=g, dtype=DT) - 0.5
    # mix of unclipped (|log r| small) and clipped tokens, away from the kinks
    shift = torch.tensor([0.01, -0.02, 0.5, -0.6, 0.03, -0.01, 0.02, 0.4], dtype=DT)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0, -1.0, -1.0, 2.0, 2.0], dtype=DT)
    mask = torch.tensor([1, 1, 1, 1, 1, 0, 1, 1], dtype=torch.bool)
    seq = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2])
    chunks = torch.tensor([0, 1, 1, 0, 0, 0, 0, 1])
    ref = old - 0.3

    def f(logp: torch.Tensor) -> torch.Tensor:
        kw = {"seq_ids": seq, "ref_logprobs": ref, "kl_coef": 0.1}
        if name == "ppo":
            return ppo_clip_loss(logp, old, adv, mask, **kw)[0]
        if name == "gspo":
            return gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, **kw)[0]
        return ipa_chunk_loss(logp, old, adv, mask, chunks, clip_low=0.2, clip_high=0.2, **kw)[0]

    x = (old + shift).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (x,), eps=1e-6, atol=1e-6)


def test_bad_inputs_raise_data_errors() -> None:
    a = t(-1.0, -1.0)
    m = ones(2)
    with pytest.raises(DataError, match="shape"):
        ppo_clip_loss(a, t(-1.0), a, m)
    with pytest.raises(DataError, match="empty"):
        ppo_clip_loss(t(), t(), t(), torch.ones(0, dtype=torch.bool))
    with pytest.raises(DataError, match="NaN"):
        ppo_clip_loss(t(-1.0, float("nan")), a, a, m)
    with pytest.raises(DataError, match="advantages"):
        gspo_loss(a, a, t(1.0, float("inf")), m)
    with pytest.raises(DataError, match="mask"):
        ppo_clip_loss(a, a, a, torch.tensor([0, 2]))
    with pytest.raises(DataError, match="norm_const"):
        ppo_clip_loss(a, a, a, m, aggregation="token-sum-norm")
    with pytest.raises(DataError, match="chunk"):
        ipa_chunk_loss(a, a, a, m, torch.tensor([0, -1]))
    with pytest.raises(DataError, match="infer"):
        ipa_chunk_loss(a, a, a, m, torch.tensor([0, 0]), mismatch_bound=0.1)
    with pytest.raises(DataError):
        ppo_clip_loss(a, a, a, m, clip_low=-0.1)
    with pytest.raises(ValueError):
        ppo_clip_loss(a, a, a, m, aggregation="mean-of-nothing")


def test_nan_at_masked_positions_gives_finite_loss_and_gradient() -> None:
    logp = leaf(-1.0, float("nan"))
    loss, _ = ppo_clip_loss(logp, t(-1.0, float("nan")), t(1.0, float("nan")), torch.tensor([1, 0]))
    loss.backward()
    assert logp.grad is not None
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all()


def test_an_all_masked_batch_gives_a_zero_loss_that_can_backward() -> None:
    logp = leaf(-1.0, -2.0)
    loss, m = gspo_loss(logp, t(-1.5, -2.5), t(1.0, 1.0), torch.zeros(2, dtype=torch.bool))
    loss.backward()
    assert loss.item() == 0.0 and m["tokens"] == 0 and logp.grad is not None


def test_huge_log_ratios_stay_finite() -> None:
    logp = leaf(-0.1, -0.1)
    for fn in (ppo_clip_loss, gspo_loss, cispo_loss):
        loss, _ = fn(logp, t(-500.0, -900.0), t(-1.0, 1.0), ones(2))
        assert torch.isfinite(loss)
