"""FSDP2 against one process, on the product's ``RankGroup`` and ``Trainer``: the same weights
after a few uneven steps, and each rank's share of the training state.

Two gloo ranks train the ``test`` model on batches that split unevenly: one rank gets more tree
micro-batches than the other, or none with a trained token, so the idle passes that keep FSDP2's
collectives in step (``Trainer._idle_pass``) run. One process trains on the whole batches. The
ranks' gathered weights must equal the single process's, and their sharded checkpoint must load
into one process unchanged.
"""

from __future__ import annotations

import functools
import random
from pathlib import Path
from typing import Any

from rollyard.core.sample import Sample

SIZE = "test"  # train/models.py: ~0.1M parameters, fast enough for three steps twice
STEPS = 3


def _sample(rng: random.Random, prompt: list[int], length: int, trained: bool) -> Sample:
    tail = [rng.randrange(3, 500) for _ in range(length)]
    adv = rng.gauss(0, 1)
    n = len(prompt) + length
    return Sample(
        token_ids=prompt + tail,
        loss_mask=[0] * len(prompt) + [int(trained)] * length,
        logprobs=[0.0] * len(prompt) + [-rng.random() * 3 - 3 for _ in tail],
        advantages=[adv] * n,
    )


def uneven_batch(step: int) -> list[Sample]:
    """Eight samples; the first half (rank 0's shard) long, the second half short. At step 1 the
    second half has no trained token; at step 2 the halves swap, so the other rank idles."""
    rng = random.Random(step)
    prompt = [rng.randrange(3, 500) for _ in range(10)]
    long = [_sample(rng, prompt, rng.randrange(20, 40), True) for _ in range(4)]
    short = [_sample(rng, prompt, rng.randrange(2, 6), step != 1) for _ in range(4)]
    return short + long if step == 2 else long + short


def _config() -> Any:
    from rollyard.train.trainer import TrainConfig

    # a small token budget: the long half packs into several micro-batches, the short into one
    return TrainConfig(lr=1e-3, eps=1e-2, max_grad_norm=0.5, token_budget=48, parallel={"kind": "fsdp2"})


def measure_fsdp(tmpdir: str | Path) -> dict[str, float]:
    """``fsdp_weight_diff``: max |w| difference, 2 FSDP2 ranks vs one process after ``STEPS``
    uneven steps; ``rank_state_ratio``: rank 0's parameter+gradient+AdamW bytes over the single
    process's; ``reshard_diff``: the ranks' checkpoint loaded by one process vs their weights."""
    import torch

    from rollyard.train.models import build_model
    from rollyard.train.ranks import RankGroup
    from rollyard.train.sharding import state_bytes
    from rollyard.train.trainer import Trainer

    torch.set_num_threads(1)
    make = functools.partial(build_model, SIZE, seed=0)
    single = Trainer(make(), _config())
    for step in range(STEPS):
        single.train_step(uneven_batch(step))
    group = RankGroup(make, _config(), world=2)
    try:
        idle = 0.0
        for step in range(STEPS):
            idle += group.train_step(uneven_batch(step))["idle_passes"]
        ranked = {k: v.clone() for k, v in group.model.state_dict().items()}
        rank_bytes = state_bytes(group.trainer.model, group.trainer.optimizer)
        checkpoint = group.save(Path(tmpdir) / "checkpoint")
    finally:
        group.close()
    reloaded = Trainer(build_model(SIZE, seed=1), _config())
    reloaded.load(checkpoint)
    mine = single.model.state_dict()
    back = reloaded.model.state_dict()
    start = make().state_dict()
    return {
        "fsdp_weight_diff": max(float((ranked[k] - v).abs().max()) for k, v in mine.items()),
        "rank_state_ratio": rank_bytes / state_bytes(single.model, single.optimizer),
        "reshard_diff": max(float((ranked[k] - v).abs().max()) for k, v in back.items()),
        "idle_passes": idle,
        "moved": max(float((v - start[k]).abs().max()) for k, v in mine.items()),  # it learned
    }
