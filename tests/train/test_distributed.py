"""Data parallel on CPU: two gloo processes make the same step as one process on the whole batch."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from train_batches import make_group

from rollyard.core import FakeClock
from rollyard.train import build_model
from rollyard.train.distributed import DataParallel, leave_group
from rollyard.train.trainer import TrainConfig, Trainer


def _config() -> TrainConfig:
    return TrainConfig(lr=1e-3, eps=1e-2, max_grad_norm=0.5)


def _batch() -> list:
    # Two groups of different shapes, so the ranks hold different numbers of tokens.
    return make_group(1, prompt=10, completions=3, completion=5) + make_group(
        2, prompt=4, completions=5, completion=9
    )


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = build_model("test", seed=100 + rank)  # different inits: rank 0's must win
        trainer = Trainer(model, _config(), clock=FakeClock(), parallel=DataParallel.from_env())
        shard = trainer.parallel.shard(_batch())
        losses = [trainer.train_step(shard)["loss"] for _ in range(2)]
        if rank == 0:
            torch.save({"losses": losses, "weights": model.state_dict()}, out)
    finally:
        leave_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_two_gloo_ranks_match_one_process_on_the_global_batch(tmp_path: Path) -> None:
    single_model = build_model("test", seed=100)
    single = Trainer(single_model, _config(), clock=FakeClock(), parallel=DataParallel())
    single_losses = [single.train_step(_batch())["loss"] for _ in range(2)]

    out = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, _free_port(), out), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    assert got["losses"] == pytest.approx(single_losses, rel=1e-5)
    for k, v in single_model.state_dict().items():
        assert torch.allclose(got["weights"][k], v, atol=1e-6), k


def test_shards_are_contiguous_and_cover_the_batch() -> None:
    items = list(range(7))
    shards = [DataParallel(rank=r, world=3).shard(items) for r in range(3)]
    assert [x for s in shards for x in s] == items
    assert all(s == sorted(s) for s in shards)
