"""Kill -9 in the middle of a run, resume it, and find every group exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from rollyard.core.tables import read_parquet
from rollyard.rollout.config import Config, dump_config
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]

STEPS = 4


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rollyard", *args]


def test_a_killed_run_resumes_with_no_lost_or_duplicated_group(
    tmp_path: Path, make_config: Callable[..., Config]
) -> None:
    cfg = make_config(**{"run.steps": STEPS, "run.checkpoint_every": 1})  # resume from a checkpoint
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(cfg))
    run = RunDir(tmp_path / "run")
    proc = subprocess.Popen(_cli("train", str(path), "--run-dir", str(run.root)), start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not run.read_metrics():
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no step finished in time"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    steps_before = [r["step"] for r in run.read_metrics()]
    assert steps_before and max(steps_before) < STEPS

    done = subprocess.run(
        _cli("train", "--resume", str(run.root)), timeout=600, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]

    rows = run.read_metrics()
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    trained = [g for r in rows for g in r["groups"]]
    assert len(trained) == len(set(trained)) == STEPS * cfg.run.groups_per_step
    ledger = torch.load(run.checkpoint / "state.pt", weights_only=False)["extra_state"]["ledger"]
    numbers = {int(n) for n in ledger["trained"]}
    assert {f"g{n:06d}" for n in numbers} == set(trained)
    ended = numbers | {int(n) for n in ledger["dropped"]}
    assert ended == set(range(max(ended) + 1)), "a group number was skipped (lost)"
    for r in rows:
        in_file = {t.group_id for t in read_parquet(run.trajectory_file(r["step"]))}
        assert in_file == set(r["groups"])
