"""Stability masks: failed and over-long negative sequences leave the loss."""

from __future__ import annotations

import pytest
import torch

from rollyard.core import DataError
from rollyard.rl.losses import ppo_clip_loss
from rollyard.rl.masks import mask_sequences, sequence_keep


def test_failed_and_long_negative_sequences_are_not_kept() -> None:
    lengths = torch.tensor([100, 30_000, 30_000, 50])
    adv = torch.tensor([-1.0, -0.5, 0.7, 0.2])
    failed = torch.tensor([False, False, False, True])
    keep = sequence_keep(lengths, adv, failed=failed, max_negative_tokens=20_000)
    assert keep.tolist() == [True, False, True, False]
    assert sequence_keep(lengths, adv, positive_only=True).tolist() == [False, False, True, True]


def test_masked_sequences_drop_out_of_the_loss() -> None:
    logp = torch.tensor([-1.0, -1.0, -1.0, -1.0], dtype=torch.float64)
    adv = torch.tensor([1.0, 1.0, -3.0, -3.0], dtype=torch.float64)
    seq = torch.tensor([0, 0, 1, 1])
    mask = mask_sequences(torch.ones(4, dtype=torch.bool), seq, torch.tensor([True, False]))
    assert mask.tolist() == [True, True, False, False]
    loss, m = ppo_clip_loss(logp, logp, adv, mask, seq_ids=seq)
    assert loss.item() == pytest.approx(-1.0) and m["tokens"] == 2
    as_float = mask_sequences(torch.ones(4), seq, torch.tensor([False, True]))
    assert as_float.tolist() == [0.0, 0.0, 1.0, 1.0]


def test_mask_helpers_reject_bad_shapes_and_values() -> None:
    with pytest.raises(DataError):
        sequence_keep(torch.tensor([1, 2]), torch.tensor([1.0]))
    with pytest.raises(DataError):
        sequence_keep(torch.tensor([1]), torch.tensor([float("nan")]))
    with pytest.raises(DataError):
        mask_sequences(torch.ones(2), torch.tensor([0, 5]), torch.tensor([True]))


def test_stability_masks_leave_out_failed_and_long_negative_samples() -> None:
    from rollyard.core import Sample
    from rollyard.rl.masks import StabilityMasks, apply_masks

    def sample(n: int, adv: float) -> Sample:
        return Sample(
            token_ids=[1] * n, loss_mask=[0] + [1] * (n - 1), logprobs=[0.0] * n, advantages=[adv] * n
        )

    samples = [sample(4, 1.0), sample(4, -1.0), sample(50, -1.0), sample(50, 1.0)]
    failed = [True, False, False, False]
    off = apply_masks(samples, failed, StabilityMasks())
    assert [s.num_loss_tokens for s in off] == [3, 3, 49, 49]
    on = apply_masks(samples, failed, StabilityMasks(unrecoverable=True, max_negative_tokens=10))
    assert [s.num_loss_tokens for s in on] == [0, 3, 0, 49]
    positive = apply_masks(samples, [False] * 4, StabilityMasks(positive_only=True))
    assert [s.num_loss_tokens for s in positive] == [3, 0, 0, 49]
