"""FSDP2 on CPU: two gloo processes make the same steps as one process on the whole batch, with
ranks holding different numbers of micro-batches, and with the lower layers frozen."""

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


def _config(train_layers: int | None = None) -> TrainConfig:
    # a small token budget: the two groups pack into different numbers of micro-batches
    return TrainConfig(lr=1e-3, eps=1e-2, max_grad_norm=0.5, token_budget=20, train_layers=train_layers)


def _batch() -> list:
    # Two groups of different shapes, so the ranks hold different numbers of tokens.
    return make_group(1, prompt=10, completions=3, completion=5) + make_group(
        2, prompt=4, completions=5, completion=9
    )


def _worker(rank: int, world: int, port: int, out: str, train_layers: int | None) -> None:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model = build_model("test", seed=100 + rank)  # different inits: rank 0's must win
        trainer = Trainer(model, _config(train_layers), clock=FakeClock(), parallel=DataParallel.from_env())
        shard = trainer.parallel.shard(_batch())
        steps = [trainer.train_step(shard) for _ in range(2)]
        full = trainer.weights()  # collective: the shards gathered on rank 0
        if rank == 0:
            losses = [m["loss"] for m in steps]
            idle = sum(m["idle_passes"] for m in steps)
            torch.save({"losses": losses, "weights": full.state_dict(), "idle": idle}, out)
    finally:
        leave_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("train_layers", [None, 1])
def test_two_gloo_ranks_match_one_process_on_the_global_batch(
    tmp_path: Path, train_layers: int | None
) -> None:
    single_model = build_model("test", seed=100)
    start = {k: v.clone() for k, v in single_model.state_dict().items()}
    single = Trainer(single_model, _config(train_layers), clock=FakeClock(), parallel=DataParallel())
    single_losses = [single.train_step(_batch())["loss"] for _ in range(2)]

    out = str(tmp_path / "rank0.pt")
    mp.spawn(_worker, args=(2, _free_port(), out, train_layers), nprocs=2, join=True)
    got = torch.load(out, weights_only=False)
    assert got["idle"] > 0  # the shards packed unevenly: a rank padded with zero-gradient passes
    assert got["losses"] == pytest.approx(single_losses, rel=1e-5)
    for k, v in single_model.state_dict().items():
        assert torch.allclose(got["weights"][k], v, atol=1e-6), k
    changed = {k for k, v in single_model.state_dict().items() if not torch.equal(v, start[k])}
    assert changed and (train_layers is None or not any(k.startswith("model.layers.0.") for k in changed))


def test_shards_are_contiguous_and_cover_the_batch() -> None:
    items = list(range(7))
    shards = [DataParallel(rank=r, world=3).shard(items) for r in range(3)]
    assert [x for s in shards for x in s] == items
    assert all(s == sorted(s) for s in shards)
