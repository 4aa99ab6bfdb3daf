"""Two data-parallel trainer ranks (gloo on CPU): they step in lockstep, hold identical weights
afterwards, and those weights are what a single trainer gets from the same batch."""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from rollyard.core import Sample
from rollyard.train.ranks import RankGroup, weights_digest
from rollyard.train.trainer import TrainConfig, Trainer


def tiny_policy(model_dir: Path) -> torch.nn.Module:
    from transformers import LlamaForCausalLM

    return LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def _samples() -> list[Sample]:
    out = []
    for i in range(4):
        ids = [5 + i, 9, 13 + i, 21, 34 + i, 55]
        out.append(
            Sample(
                token_ids=ids,
                loss_mask=[0, 0, 1, 1, 1, 1],
                logprobs=[0.0, 0.0, -2.0, -2.5, -3.0, -1.0],
                advantages=[0.0, 0.0] + [1.0 if i % 2 else -1.0] * 4,
            )
        )
    return out


def test_two_ranks_step_and_publish_identical_weights(tiny_model_dir: Path) -> None:
    cfg = TrainConfig(lr=1e-3)
    make = functools.partial(tiny_policy, tiny_model_dir)
    group = RankGroup(make, cfg, world=2)
    try:
        before = weights_digest(group.model)
        metrics = group.train_step(_samples())
        assert metrics["ranks"] == 2 and metrics["ranks_in_sync"] == 1.0  # workers' digests matched
        assert weights_digest(group.model) != before
        ranked = {k: v.clone() for k, v in group.model.state_dict().items()}
    finally:
        group.close()
    single = Trainer(make(), cfg)
    start = {k: v.clone() for k, v in single.model.state_dict().items()}
    single.train_step(_samples())
    # The same update up to float summation order (gradients summed over ranks; Adam's first step
    # moves every weight by about lr, so 2e-5 is 2% of an update).
    for k, v in single.model.state_dict().items():
        torch.testing.assert_close(ranked[k], v, rtol=0.0, atol=2e-5)
    moved = max(float((v - start[k]).abs().max()) for k, v in single.model.state_dict().items())
    assert moved > 5e-4
