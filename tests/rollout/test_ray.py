"""Rollout workers as Ray actors on a local cluster produce the same kind of groups."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from rollyard.core.tables import read_parquet
from rollyard.rollout.config import Config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]


async def test_ray_workers_run_agents_in_sandboxes_and_groups_train(
    tmp_path: Path, make_config: Callable[..., Config], caplog: pytest.LogCaptureFixture
) -> None:
    pytest.importorskip("ray")
    caplog.set_level(logging.INFO, logger="rollyard.rollout.gateway_proc")
    # bound to every address, workers handed another loopback address than the local one
    over = {"gateway.host": "0.0.0.0", "gateway.advertise": "127.0.0.2"}
    cfg = make_config(**{"run.steps": 1, "ray.address": "local", "ray.workers": 2, **over})
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    assert last["step"] == 1 and last["policy_version"] == 1
    trajs = read_parquet(run.trajectory_file(1))
    assert len(trajs) == cfg.run.groups_per_step * cfg.run.group_size
    assert all(t.num_turns >= 1 and t.outcome is not None for t in trajs)
    assert all(t.outcome.details.get("agent_status") for t in trajs if t.outcome)
    assert "advertised=http://127.0.0.2:" in caplog.text  # what the workers were handed
    # The private cluster's session dir is recorded and removed at the end.
    session = Path((run.logs / "ray_temp_dir.txt").read_text().strip())
    assert session.name.startswith("ryray-") and not session.exists()


async def test_blackbox_agents_on_ray_workers_reach_their_shard_through_the_node_relay(
    tmp_path: Path, make_config: Callable[..., Config]
) -> None:
    """A black-box agent's sandbox on a worker has no network: its socket is the worker node's
    relay, which passes its connections to the gateway's advertised TCP address (its program's
    shard). Here the relay dials 127.0.0.2, which only a TCP client reaches."""
    pytest.importorskip("ray")
    relays_before = set(Path("/tmp").glob("ry-relay-*"))
    over = {"gateway.host": "0.0.0.0", "gateway.advertise": "127.0.0.2", "gateway.workers": 2}
    agent = {"agent.kind": "blackbox", "agent.profile": "openai"}
    cfg = make_config(**{"run.steps": 1, "ray.address": "local", "ray.workers": 2, **over, **agent})
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    assert last["step"] == 1 and last["policy_version"] == 1
    trajs = read_parquet(run.trajectory_file(1))
    assert len(trajs) == cfg.run.groups_per_step * cfg.run.group_size
    assert all(t.num_turns >= 1 for t in trajs)  # every agent reached the model through a relay
    assert all(
        t.outcome and t.outcome.details.get("agent_status") in ("exited", "agent_error") for t in trajs
    )
    assert set(Path("/tmp").glob("ry-relay-*")) == relays_before  # the workers closed their relays
