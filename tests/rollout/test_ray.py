"""Rollout workers as Ray actors on a local cluster produce the same kind of groups."""

from __future__ import annotations

import logging
import time
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


async def test_engine_as_a_ray_actor_serves_on_its_node_address_and_is_restarted_after_dying(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    """``engine.placement: ray``: the launcher's vLLM runs inside an actor, bound to the node's
    address; when its process dies, the fleet's health check finds it and restarts it there, on
    the same URL the gateway knows."""
    pytest.importorskip("ray")
    import os
    import signal

    import httpx
    import ray

    from rollyard.core.engine_key import engine_headers
    from rollyard.engines.launcher import group_members
    from rollyard.rollout.config import builtin_config
    from rollyard.rollout.ray_runner import ray_session
    from rollyard.rollout.services import start_engines

    over = {"model.path": str(tiny_model_dir), "model.create": False, "ray.address": "local"}
    cfg = builtin_config("quick", {**over, "engine.placement": "ray", "engine.max_model_len": 1024})
    assert cfg.engines_on_ray
    with ray_session(cfg, tmp_path):
        fleet = start_engines(cfg, tmp_path, tiny_model_dir, 0)
        try:
            (engine,) = fleet.servers
            node_ip = ray.util.get_node_ip_address()
            assert engine.url.startswith(f"http://{node_ip}:") and not node_ip.startswith("127.")
            assert httpx.get(f"{engine.url}/health", headers=engine_headers()).status_code == 200
            first = (engine.url, engine.pid)  # type: ignore[attr-defined]
            os.killpg(first[1], signal.SIGKILL)  # the engine crashes on its node
            deadline = time.monotonic() + 30
            while engine.alive() and time.monotonic() < deadline:
                time.sleep(0.5)
            assert not engine.alive()
            assert await fleet.heal() and fleet.restarts == 1
            assert engine.alive() and engine.url == first[0] and engine.pid != first[1]  # type: ignore[attr-defined]
            assert httpx.get(f"{engine.url}/health", headers=engine_headers()).status_code == 200
        finally:
            fleet.stop()
        # the restarted vLLM's process group is gone (a stopped engine's alive() is False anyway)
        assert not group_members(engine.pid)  # type: ignore[attr-defined]
