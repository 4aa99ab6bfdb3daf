"""An engine killed mid-run is restarted on the live weights and the run finishes every step."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from rollyard.core.tables import read_parquet
from rollyard.rollout.config import builtin_config, dump_config
from rollyard.rollout.rundir import RunDir

from .conftest import engine_pids, wait_for_first_step

pytestmark = [pytest.mark.slow]

STEPS = 2  # killed after step 1; step 2 runs on the restarted engine


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def test_a_killed_engine_is_restarted_and_the_run_finishes(tmp_path: Path, tiny_model_dir: Path) -> None:
    cfg = builtin_config(
        "quick",
        {
            "model.path": str(tiny_model_dir),
            "model.create": False,
            "run.steps": STEPS,
            "engine.kv_tokens": 4096,
        },
    )
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(cfg))
    run = RunDir(tmp_path / "run")
    err = tmp_path / "stderr.txt"  # a file, not a pipe: an unread pipe blocks the child
    argv = [sys.executable, "-m", "rollyard", "train", str(path), "--run-dir", str(run.root)]
    with err.open("w") as err_file:
        proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err_file, start_new_session=True)
    try:
        wait_for_first_step(proc, run, err)
        first = engine_pids(run)
        assert len(first) == 1, first
        _kill_group(first[0])  # kill -9 the engine and its workers, mid-run
        rc = proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in engine_pids(run):
            _kill_group(pid)
    assert rc == 0, err.read_text()[-3000:]
    pids = engine_pids(run)
    assert len(pids) >= 2 and pids[0] == first[0], "the dead engine was not restarted"
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[-1]["engine_restarts"] >= 1
    # The restarted engine serves the live weights: versions in later trajectories keep rising.
    last = read_parquet(run.trajectory_file(STEPS))
    assert max(v for t in last for v in t.policy_versions) >= 1
