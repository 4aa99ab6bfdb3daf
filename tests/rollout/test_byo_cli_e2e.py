"""Bring your own agent CLI: a CLI no shipped profile uses, installed from its own profile, trains
a step; a profile whose CLI cannot start stops the run quickly with the CLI's own error."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from rollyard.core.errors import AgentFailed
from rollyard.core.tables import read_parquet
from rollyard.rollout.config import Config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]

BYO_CLI = Path(__file__).resolve().parents[1] / "agents" / "byo_cli"


def profile(tmp_path: Path, **fields: object) -> Path:
    base = {
        "name": "byo",
        "description": "the tests' own CLI, published nowhere",
        "command": ["byo-agent", "{task}"],
        "env": {"OPENAI_BASE_URL": "{base_url}", "OPENAI_API_KEY": "{api_key}", "AGENT_MODEL": "{model}"},
        "task_input": "arg",
        "limits": {"memory_mb": 1536},
    }
    path = tmp_path / "byo.yaml"
    path.write_text(yaml.safe_dump({**base, **fields}))
    return path


async def test_a_cli_of_our_own_installs_from_its_profile_and_trains_a_step(
    tmp_path: Path,
    make_config: Callable[..., Config],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    # the sandbox's unprivileged user must reach the installed CLI: pytest's tmp dirs are private
    cache = Path(tempfile.mkdtemp(prefix="rollyard-byo-", dir="/tmp"))
    cache.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(cache, ignore_errors=True))
    monkeypatch.setenv("ROLLYARD_CACHE", str(cache))
    source = shutil.copytree(BYO_CLI, tmp_path / "byo_cli")  # pip builds in place: not in the tree
    prof = profile(tmp_path, install={"pypi": str(source)})
    cli = [str(Path(sys.executable).parent / "rollyard"), "agents"]
    env = {**os.environ, "COLUMNS": "250"}
    out = subprocess.run([*cli, "install", str(prof)], capture_output=True, text=True, check=True).stdout
    assert out.startswith("byo ") and str(cache) in out
    listed = subprocess.run([*cli, "list", str(prof)], capture_output=True, text=True, check=True, env=env)
    (row,) = [line for line in listed.stdout.splitlines() if line.strip("│ ").startswith("byo ")]
    assert "pypi" in row and "yes" in row
    cfg = make_config(
        **{
            "agent.kind": "blackbox",
            "agent.profile": str(prof),
            "run.steps": 1,
            "run.group_size": 8,  # rewards all equal in both groups: ~1/16,000 (1/64 at 4: seen once)
            "run.max_groups_in_flight": 2,
            "run.loggers": ["jsonl", "tensorboard"],
        }
    )
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    assert last["policy_version"] == 1
    trajs = read_parquet(run.trajectory_file(1))
    assert len(trajs) == cfg.run.groups_per_step * cfg.run.group_size
    for t in trajs:
        assert t.num_turns == 1 and t.outcome is not None
        assert t.outcome.details["agent_rc"] == 0, t.outcome.details
        assert t.outcome.details["agent_status"] == "exited"
    # the CLI reads the data or guesses by the parity of what the policy sampled: rewards differ
    # within a group (by chance: all-equal in both groups of 8 has probability ~2^-14) and the step
    # learns
    assert last["train_grad_norm"] > 0
    # every metric the run wrote went to TensorBoard too: read the event file back
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run.root / "tensorboard"))
    events.Reload()
    assert "train_grad_norm" in events.Tags()["scalars"]
    (point,) = events.Scalars("train_grad_norm")
    assert point.step == 1 and point.value == pytest.approx(last["train_grad_norm"], rel=1e-6)


async def test_a_profile_whose_cli_cannot_start_stops_the_run_with_its_stderr(
    tmp_path: Path, make_config: Callable[..., Config]
) -> None:
    prof = profile(tmp_path, command=["byo-agent-that-is-not-there", "{task}"])
    cfg = make_config(
        **{"agent.kind": "blackbox", "agent.profile": str(prof), "agent.max_silent_programs": 4}
    )
    t0 = time.monotonic()
    with pytest.raises(AgentFailed, match="4 programs in a row") as err:
        await train(cfg, RunDir(tmp_path / "run"))
    assert time.monotonic() - t0 < 120  # gateway, sandboxes and four programs; the engine is up
    assert "exited with status 127" in err.value.message
    assert "byo-agent-that-is-not-there" in err.value.message  # bash's own "command not found"
