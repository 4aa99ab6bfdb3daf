"""Ctrl-C: the run stops promptly, no process it started outlives it, and the run dir stays resumable.

The child starts with SIGINT ignored, as every command started with ``&`` from a non-interactive
shell (a CI script, ``make test &``) does: that is how the full suite used to hang (the in-process
uvicorn took the signal, shut the gateway down and re-raised it into SIG_IGN, so the run never
tore down). It must not matter: ``kill -INT`` has to stop a run whatever it inherited.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollyard.rollout.config import builtin_config, dump_config
from rollyard.rollout.rundir import RunDir

from .conftest import engine_pids, wait_for_first_step

pytestmark = [pytest.mark.slow]


def _gone(pid: int) -> bool:
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time) of a live process, None when it is gone (or a zombie)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[19]))


def _descendants(root: int) -> dict[int, int]:
    """Every live process below ``root`` (engine, its workers, sandboxes), with its start time."""
    stats = {int(d): st for d in os.listdir("/proc") if d.isdigit() and (st := _stat(int(d)))}
    found: dict[int, int] = {}
    frontier = [root]
    while frontier:
        parent = frontier.pop()
        for pid, (ppid, start) in stats.items():
            if ppid == parent and pid not in found:
                found[pid] = start
                frontier.append(pid)
    return found


# SIGINT ignored, then exec (no preexec_fn in a threaded test process): what `cmd &` inherits.
IGNORING_SIGINT = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']


def test_sigint_tears_down_the_engine_and_leaves_a_resumable_run(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cfg = builtin_config(
        "quick",
        # a checkpoint every step (the default is every 10), so the interrupted run has one to resume
        {
            "model.path": str(tiny_model_dir),
            "model.create": False,
            "run.steps": 50,
            "engine.kv_tokens": 4096,
            "run.checkpoint_every": 1,
        },
    )
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(cfg))
    run = RunDir(tmp_path / "run")
    # Output goes to a file, not a pipe: an unread pipe fills up and blocks the child's exit.
    err = tmp_path / "stderr.txt"
    argv = [sys.executable, "-m", "rollyard", "train", str(path), "--run-dir", str(run.root)]
    with err.open("w") as err_file:
        proc = subprocess.Popen(
            [*IGNORING_SIGINT, *argv],
            stdout=subprocess.DEVNULL,
            stderr=err_file,
        )
    try:
        wait_for_first_step(proc, run, err)
        started = _descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        # Teardown stops the gateway, the sandbox pool and the engine (up to 5 s); the run forces
        # its exit after 90 s whatever happens, so this bound is generous on a loaded box.
        rc = proc.wait(timeout=240)
        teardown_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            for pid in engine_pids(run):  # a hung run must not leave its engine to the next tests
                if not _gone(pid):
                    os.killpg(pid, signal.SIGKILL)
    assert rc == 130, err.read_text()[-2000:]
    assert teardown_s < 120, f"teardown took {teardown_s:.0f} s"
    pids = engine_pids(run)
    assert pids, "the run started no engine"
    for _ in range(40):
        if all(_gone(p) for p in pids):
            break
        time.sleep(0.25)
    assert all(_gone(p) for p in pids), "an engine process outlived the run"
    assert started, "the run had no child processes when it was interrupted"
    for _ in range(40):  # SIGKILLed processes are reaped a moment later
        orphans = [pid for pid, start in started.items() if (st := _stat(pid)) and st[1] == start]
        if not orphans:
            break
        time.sleep(0.25)
    assert not orphans, f"processes outlived the run: {orphans}"
    log = (run.logs / "run.log").read_text()
    assert "services stopped" in log
    assert "closed database" not in log + err.read_text()
    assert "forced exit" not in log, "the orderly teardown did not finish within its grace period"
    assert run.has_checkpoint()
    assert run.load_config().run.steps == 50
