"""The ipa loss in the trainer's objective: the train side is the trainer's own logprobs, the
inference side what the engine recorded; their per-chunk gap is reported and masked."""

from __future__ import annotations

import pytest
import torch

from rollyard.core import Sample
from rollyard.train.objective import BatchTotals, LossConfig, micro_batch_loss


def _sample(recorded: list[float], chunks: list[int]) -> Sample:
    n = len(recorded)
    return Sample(
        token_ids=list(range(1, n + 1)),
        loss_mask=[0] + [1] * (n - 1),
        logprobs=recorded,
        advantages=[0.0] + [1.0] * (n - 1),
        chunk_ids=chunks,
    )


def test_ipa_measures_the_train_inference_gap_per_chunk_and_masks_past_the_bound() -> None:
    # trainer logprobs for tokens 1..4: chunk 0 agrees with the engine, chunk 1 is off by 0.5
    s = _sample([0.0, -1.0, -1.0, -1.5, -1.5], [-1, 0, 0, 1, 1])
    train = torch.tensor([0.0, -1.0, -1.0, -1.0, -1.0], requires_grad=True)
    totals = BatchTotals.of([s])
    _, m = micro_batch_loss(LossConfig(kind="ipa"), [train], [s], totals)
    assert m["mismatch_mean"] == pytest.approx(0.25) and m["mismatch_max"] == pytest.approx(0.5)
    assert m["chunk_mask_frac"] == 0.0
    cfg = LossConfig(kind="ipa", options={"mismatch_bound": 0.3})
    loss, m = micro_batch_loss(cfg, [train], [s], totals)
    assert m["chunk_mask_frac"] == pytest.approx(0.5)
    loss.backward()
    assert train.grad is not None
    assert train.grad[3] == 0 and train.grad[4] == 0 and train.grad[1] != 0  # chunk 1 is masked out
