"""``run.mode: sync`` with the seer policy and divided rollout, end to end on real parts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rollyard.core.tables import read_parquet
from rollyard.rollout.config import Config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]


async def test_sync_steps_roll_out_then_train_with_seer_and_divided_rollout(
    tmp_path: Path, make_config: Callable[..., Config]
) -> None:
    cfg = make_config(
        **{
            "run.mode": "sync",
            "run.max_groups_in_flight": 8,  # async would start step 2's groups under version 0
            "gateway.policy": "seer",
            "gateway.divided": {"chunk_tokens": 8},
        }
    )
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2] and last["policy_version"] == 2
    assert [r["staleness"] for r in rows] == [0, 0]
    for step in (1, 2):
        trajs = read_parquet(run.trajectory_file(step))
        assert len(trajs) == cfg.run.groups_per_step * cfg.run.group_size
        # sync: every turn of step k's rollout ran on the weights step k-1 published
        assert {v for t in trajs for v in t.policy_versions} == {step - 1}
        notes = [(t.group_id, e.turn_index, e.data) for t in trajs for e in t.events if e.kind == "note"]
        # seer ranked every turn; each group's first request ran as its probe (priority 0)
        for gid in {t.group_id for t in trajs}:
            ranked = [d["priority"] for g, _, d in notes if g == gid and "priority" in d]
            assert ranked and 0 in ranked
        # divided rollout fired: some generation ran in several chunks
        chunks = [d["divided"]["chunks"] for _, _, d in notes if "divided" in d]
        assert chunks and max(chunks) >= 2
