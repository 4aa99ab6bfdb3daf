"""Ctrl-C: the run stops, its engine process group is gone, and the run dir stays resumable."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollyard.rollout.config import builtin_config, dump_config
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.slow]


def _engine_pids(run: RunDir) -> list[int]:
    log = run.logs / "run.log"
    return [int(p) for p in re.findall(r"vllm starting pid=(\d+)", log.read_text())] if log.exists() else []


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.xfail(
    reason="known bug: after the rest of the suite has run, SIGINT teardown hangs before 'services stopped' "
    "(3 of 3 full-suite runs; passes alone 5 of 5); in-flight programs see their engine vanish first. "
    "Tracked in the main-job issue.",
    strict=False,
)
def test_sigint_tears_down_the_engine_and_leaves_a_resumable_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cfg = builtin_config(
        "quick",
        {"model.path": str(tiny_model_dir), "model.create": False, "run.steps": 50, "engine.kv_tokens": 4096},
    )
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(cfg))
    run = RunDir(tmp_path / "run")
    # Output goes to a file, not a pipe: an unread pipe fills up and blocks the child's exit.
    err = tmp_path / "stderr.txt"
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollyard", "train", str(path), "--run-dir", str(run.root)],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        deadline = time.monotonic() + 420
        while not run.read_metrics():
            assert proc.poll() is None, err.read_text()[-2000:]
            assert time.monotonic() < deadline, "no step finished in time"
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        # Teardown stops the engine (up to 15 s), the gateway and the sandbox pool; generous on a loaded box.
        rc = proc.wait(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for pid in _engine_pids(run):  # a hung run must not leave its engine to the next tests
                if not _gone(pid):
                    os.killpg(pid, signal.SIGKILL)
    assert rc == 130
    pids = _engine_pids(run)
    assert pids, "the run started no engine"
    for _ in range(40):
        if all(_gone(p) for p in pids):
            break
        time.sleep(0.25)
    assert all(_gone(p) for p in pids), "an engine process outlived the run"
    assert run.has_checkpoint()
    assert run.load_config().run.steps == 50
