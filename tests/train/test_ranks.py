"""Two FSDP2 trainer ranks (gloo on CPU): they step in lockstep, publish the weights a single
trainer gets from the same batch, and their sharded checkpoints load at another world size."""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from rollyard.core import Sample
from rollyard.core.errors import TrainError
from rollyard.train.ranks import RankGroup
from rollyard.train.trainer import TrainConfig, Trainer


def tiny_policy(model_dir: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def policy_rank_0_only(model_dir: Path) -> torch.nn.Module:
    """The model on rank 0; a worker rank's node "lacks" it (spawned ranks see torchrun's RANK)."""
    if os.environ.get("RANK", "0") != "0":
        raise FileNotFoundError(f"{model_dir} is not on this node")
    return tiny_policy(model_dir)


def _samples(seed: int = 0) -> list[Sample]:
    out = []
    for i in range(4):
        ids = [5 + i + seed, 9, 13 + i, 21, 34 + i, 55]
        out.append(
            Sample(
                token_ids=ids,
                loss_mask=[0, 0, 1, 1, 1, 1],
                logprobs=[0.0, 0.0, -2.0, -2.5, -3.0, -1.0],
                advantages=[0.0, 0.0] + [1.0 if (i + seed) % 2 else -1.0] * 4,
            )
        )
    return out


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float) -> None:
    assert a.keys() == b.keys()
    for k, v in b.items():
        torch.testing.assert_close(a[k], v, rtol=0.0, atol=atol, msg=k)


@pytest.mark.parametrize("kind", ["fsdp2", "replicate"])
def test_two_ranks_step_and_publish_the_single_trainers_weights(tiny_model_dir: Path, kind: str) -> None:
    cfg = TrainConfig(lr=1e-3, parallel={"kind": kind})
    make = functools.partial(tiny_policy, tiny_model_dir)
    group = RankGroup(make, cfg, world=2)
    try:
        before = _weights(group.model)
        metrics = group.train_step(_samples())
        assert metrics["ranks"] == 2
        # replicas compare their checksums; shards have nothing to compare (each holds its part)
        assert metrics.get("ranks_in_sync") == (1.0 if kind == "replicate" else None)
        ranked = _weights(group.model)
    finally:
        group.close()
    single = Trainer(make(), cfg)
    single.train_step(_samples())
    # the same update up to float summation order (chunked head, rank sums): Adam's first step
    # moves every weight by about lr = 1e-3, so 2e-5 is 2% of an update
    _assert_same(ranked, _weights(single.model), atol=2e-5)
    moved = max(float((v - before[k]).abs().max()) for k, v in ranked.items())
    assert moved > 5e-4


def test_a_sharded_checkpoint_resumes_at_another_world_size(tiny_model_dir: Path, tmp_path: Path) -> None:
    """2 ranks save -> 1 process loads; 1 process saves -> 2 ranks load: weights, optimizer state
    and counters carry over, so the next step equals the one straight-through training makes."""
    cfg = TrainConfig(lr=1e-3)
    make = functools.partial(tiny_policy, tiny_model_dir)
    straight = Trainer(make(), cfg)
    for seed in range(3):
        straight.train_step(_samples(seed))

    group = RankGroup(make, cfg, world=2)
    try:
        group.train_step(_samples(0))
        saved_by_two = _weights(group.model)
        group.save(tmp_path / "two", extra_state={"ledger": [1, 2]})
    finally:
        group.close()
    assert (tmp_path / "two" / "dcp" / ".metadata").is_file()

    one = Trainer(make(), cfg)
    assert one.load(tmp_path / "two") == {"ledger": [1, 2]} and one.step == 1
    _assert_same(_weights(one.model), saved_by_two, atol=0.0)
    one.train_step(_samples(1))  # uses the loaded AdamW moments
    one.save(tmp_path / "one")

    group = RankGroup(make, cfg, world=2)
    try:
        group.load(tmp_path / "one")
        assert group.trainer.step == 2
        _assert_same(_weights(group.model), _weights(one.model), atol=0.0)
        group.train_step(_samples(2))
        final = _weights(group.model)
    finally:
        group.close()
    _assert_same(final, _weights(straight.model), atol=5e-6)


def test_a_spawned_rank_that_cannot_load_its_model_fails_the_start_instead_of_hanging(
    tiny_model_dir: Path,
) -> None:
    make = functools.partial(policy_rank_0_only, tiny_model_dir)
    t0 = time.monotonic()
    with pytest.raises(TrainError, match="trainer rank 1 is gone"):
        RankGroup(make, TrainConfig(), world=2)
    assert time.monotonic() - t0 < 30  # spawn and load included; no wait on the rendezvous
    assert not torch.distributed.is_initialized()


def fail_rank_0_at_the_rendezvous(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Rank 0 fails just as it would join (its own load failing, say), while its workers already
    wait in ``init_process_group``; returns the list the failure's time is put in. Patched in
    this process only: spawned ranks and Ray actors import the real ``_init``."""
    from rollyard.train import ranks

    failed: list[float] = []
    real = ranks._init

    def init(rank: int, *args: Any, **kwargs: Any) -> None:
        if rank == 0:
            time.sleep(1.0)  # the workers reach the rendezvous first
            failed.append(time.monotonic())
            raise TrainError("rank 0 could not load its model")
        real(rank, *args, **kwargs)

    monkeypatch.setattr(ranks, "_init", init)
    return failed


def test_a_failed_start_on_rank_0_stops_the_waiting_workers_at_once(
    tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failed = fail_rank_0_at_the_rendezvous(monkeypatch)
    with pytest.raises(TrainError, match="rank 0 could not load"):
        RankGroup(functools.partial(tiny_policy, tiny_model_dir), TrainConfig(), world=3)
    assert time.monotonic() - failed[0] < 10  # was 30 s a worker (proc.join on "stop")
    assert not [p for p in mp.active_children() if p.name.startswith("rollyard-rank")]
    assert not torch.distributed.is_initialized()


def test_a_collective_a_rank_never_meets_fails_after_the_groups_timeout(tiny_model_dir: Path) -> None:
    """``collective_timeout_s`` reaches the group: rank 0 alone in an all-reduce (its worker waits
    for a command) fails in about that time instead of torch's 30 minutes."""
    import time

    make = functools.partial(tiny_policy, tiny_model_dir)
    group = RankGroup(make, TrainConfig(), world=2, collective_timeout_s=2.0)
    try:
        t0 = time.monotonic()
        with pytest.raises(RuntimeError):
            torch.distributed.all_reduce(torch.ones(1))
        elapsed = time.monotonic() - t0
    finally:
        group.close()
    assert 1.5 < elapsed < 20
