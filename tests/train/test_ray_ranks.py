"""Trainer ranks through a Ray placement group (``trainer.placement: ray``) on a local cluster:
rank 1 is an actor in one placement group, the ranks meet at this node's routable address,
train the single trainer's step, and a lost rank actor stops the step with a TrainError."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from test_ranks import _assert_same, _samples, _weights

from rollyard.core.errors import TrainError
from rollyard.rollout.orchestrator import load_policy
from rollyard.train.ranks import RankGroup, RayPlacement
from rollyard.train.trainer import TrainConfig, Trainer

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A private two-CPU cluster, its session in a short temp dir (Ray's socket path limit)."""
    tmp = tempfile.mkdtemp(prefix="ryray-", dir="/tmp")
    ray.init(num_cpus=2, _temp_dir=tmp, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _groups() -> list[dict]:
    return list(ray.util.placement_group_table().values())


@pytest.mark.parametrize("kind", ["fsdp2", "replicate"])
def test_rank_actor_in_a_placement_group_trains_the_single_trainers_step(
    local_ray: None,
    tiny_model_dir: Path,
    kind: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.INFO, logger="rollyard.train.ranks")
    cfg = TrainConfig(lr=1e-3, parallel={"kind": kind})
    make = functools.partial(load_policy, tiny_model_dir)  # importable on the actor's side
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    group = RankGroup(make, cfg, world=2, ray=RayPlacement(cpus_per_rank=1))
    try:
        # rank 0's gloo interface was bound for its groups only: engines started now inherit none
        assert "GLOO_SOCKET_IFNAME" not in os.environ
        assert group.placement == "ray"
        (pg,) = [g for g in _groups() if g["state"] == "CREATED"]  # one group, one bundle for rank 1
        assert list(pg["bundles"].values()) == [{"CPU": 1.0}] and pg["strategy"] == "PACK"
        # rank 0 published its node's address as the rendezvous, not loopback
        rendezvous = caplog.text.split("rendezvous=", 1)[1].split(":", 1)[0]
        assert rendezvous == ray.util.get_node_ip_address() and not rendezvous.startswith("127.")
        before = _weights(group.model)
        metrics = group.train_step(_samples())
        assert metrics["ranks"] == 2 and metrics["ranks_on_ray"] == 1.0
        assert metrics["grad_norm"] > 0
        # replicas compare checksums with rank 0 after every step (a mismatch raises)
        assert metrics.get("ranks_in_sync") == (1.0 if kind == "replicate" else None)
        ranked = _weights(group.model)
    finally:
        group.close()
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    assert all(g["state"] == "REMOVED" for g in _groups())
    single = Trainer(make(), cfg)
    single.train_step(_samples())
    _assert_same(ranked, _weights(single.model), atol=2e-5)  # as tests/train/test_ranks.py
    moved = max(float((v - before[k]).abs().max()) for k, v in ranked.items())
    assert moved > 5e-4


def test_a_lost_rank_actor_fails_the_step_with_a_train_error(local_ray: None, tiny_model_dir: Path) -> None:
    make = functools.partial(load_policy, tiny_model_dir)  # importable on the actor's side
    group = RankGroup(make, TrainConfig(lr=1e-3), world=2, ray=RayPlacement(cpus_per_rank=2))
    try:
        group.train_step(_samples())
        (actor,) = group._workers.actors  # type: ignore[attr-defined]
        # the rank trains on the CPUs its bundle reserved (trainer.cpus_per_rank), not one thread
        assert ray.get(actor.__ray_call__.remote(lambda _: torch.get_num_threads())) == 2
        ray.kill(actor)
        with pytest.raises(TrainError, match=r"trainer rank 1 .*lost.*--resume"):
            group.train_step(_samples(1))
    finally:
        group.close()
    assert all(g["state"] == "REMOVED" for g in _groups())
    assert not torch.distributed.is_initialized()  # rank 0 left the broken group too


def test_a_rank_actor_that_cannot_start_fails_the_start_instead_of_hanging(
    local_ray: None, tiny_model_dir: Path
) -> None:
    """The actor's node lacks the code of the model factory (here: a test module Ray's workers
    cannot import): its join fails before the rendezvous, and rank 0 says so instead of waiting."""
    from test_ranks import tiny_policy

    make = functools.partial(tiny_policy, tiny_model_dir)
    with pytest.raises(TrainError, match=r"trainer rank 1 .*test_ranks"):
        RankGroup(make, TrainConfig(), world=2, ray=RayPlacement(cpus_per_rank=1))
    assert all(g["state"] == "REMOVED" for g in _groups())
    assert not torch.distributed.is_initialized()


def test_a_failed_start_on_rank_0_kills_the_waiting_rank_actors_at_once(
    local_ray: None, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The actor waits in the rendezvous inside ``join``, so a ``stop`` call would queue behind
    it (60 s, then killed): an actor that never joined is killed at once."""
    from test_ranks import fail_rank_0_at_the_rendezvous

    failed = fail_rank_0_at_the_rendezvous(monkeypatch)
    make = functools.partial(load_policy, tiny_model_dir)
    with pytest.raises(TrainError, match="rank 0 could not load"):
        RankGroup(make, TrainConfig(), world=2, ray=RayPlacement(cpus_per_rank=1))
    assert time.monotonic() - failed[0] < 10
    assert all(g["state"] == "REMOVED" for g in _groups())
    assert not torch.distributed.is_initialized()


def test_rank_zeros_reserved_gpu_maps_through_its_own_visible_devices() -> None:
    """The GPU id Ray reports for rank 0's bundle is a raylet-wide id: without our own
    CUDA_VISIBLE_DEVICES it is torch's index, with it the id's place in that list."""
    from rollyard.train.ray_ranks import cuda_index

    assert cuda_index("3", None) == 3
    assert cuda_index("3", "") == 3
    assert cuda_index("3", "2,3") == 1
    with pytest.raises(TrainError, match=r"GPU 5 .*CUDA_VISIBLE_DEVICES=2,3"):
        cuda_index("5", "2,3")


def test_a_pre_set_gloo_interface_is_kept_and_no_interface_is_warned(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from rollyard.train.ray_ranks import gloo_interface

    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "mine0")
    with gloo_interface("127.0.0.1"):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"
    assert os.environ["GLOO_SOCKET_IFNAME"] == "mine0"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME")
    with gloo_interface("203.0.113.9"):  # TEST-NET-3: on no interface here
        assert "GLOO_SOCKET_IFNAME" not in os.environ
    assert "no network interface holds 203.0.113.9" in caplog.text


def test_an_actor_that_cannot_be_created_leaves_no_placement_group(
    local_ray: None, tiny_model_dir: Path
) -> None:
    """Ray refuses to send the actor's arguments (a lock cannot be pickled): the group reserved
    for it is removed, not left holding the cluster's CPUs."""
    import threading

    make = functools.partial(load_policy, tiny_model_dir, lock=threading.Lock())
    with pytest.raises(TypeError, match="pickle"):
        RankGroup(make, TrainConfig(), world=2, ray=RayPlacement(cpus_per_rank=1))
    assert _groups() and all(g["state"] == "REMOVED" for g in _groups())
