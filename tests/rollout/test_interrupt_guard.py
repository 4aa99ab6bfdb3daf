"""The run's signal handling, without engines: first Ctrl-C tears down in order, a second one (or
the grace period passing) forces the exit after the last-resort hooks, and an inherited SIG_IGN
(``cmd &`` in a script) does not make the run deaf.

The signal cases run in a child process: once interrupted, the guard keeps owning the signals and
its watchdog stays armed until the process exits, which must not happen to the test runner. Also
here: what an interrupted run needs to be resumable (the checkpoint's weights are kept).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    from rollyard.rollout.interrupt import InterruptGuard, on_forced_exit

    out, mode, grace = Path(sys.argv[1]), sys.argv[2], float(sys.argv[3])

    async def main():
        with on_forced_exit(lambda: (out / "hook").write_text("killed")):
            try:
                (out / "ready").write_text("")
                await asyncio.sleep(60)
            finally:
                (out / "teardown").write_text("")
                if mode == "hang-async":
                    await asyncio.sleep(60)
                elif mode == "hang-sync":
                    time.sleep(60)
                (out / "clean").write_text("")

    try:
        InterruptGuard(grace).run(main())
    except KeyboardInterrupt:
        sys.exit(130)
    sys.exit(0)
    """
)


# SIGINT ignored, then exec: the disposition a non-interactive shell gives a `cmd &`.
IGNORING_SIGINT = ["sh", "-c", 'trap "" INT; exec "$0" "$@"']


def _start(tmp_path: Path, mode: str, grace_s: float, ignore_sigint: bool = False) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-c", CHILD, str(tmp_path), mode, str(grace_s)]
    proc = subprocess.Popen([*IGNORING_SIGINT, *argv] if ignore_sigint else argv, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None, "the child died before it was ready"
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _wait_for(path: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


@pytest.mark.parametrize("ignore_sigint", [False, True], ids=["default", "inherited-SIG_IGN"])
def test_first_sigint_runs_the_orderly_teardown(tmp_path: Path, ignore_sigint: bool) -> None:
    proc = _start(tmp_path, "clean", 60, ignore_sigint)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert (tmp_path / "clean").exists()
    assert not (tmp_path / "hook").exists()


def test_sigterm_is_handled_like_sigint(tmp_path: Path) -> None:
    proc = _start(tmp_path, "clean", 60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 130
    assert (tmp_path / "clean").exists()


@pytest.mark.parametrize("mode", ["hang-async", "hang-sync"])
def test_second_sigint_forces_the_exit_and_runs_the_hooks(tmp_path: Path, mode: str) -> None:
    proc = _start(tmp_path, mode, 120)
    proc.send_signal(signal.SIGINT)
    _wait_for(tmp_path / "teardown")
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert time.monotonic() - t0 < 10
    assert (tmp_path / "hook").read_text() == "killed"
    assert not (tmp_path / "clean").exists()


def test_a_hung_teardown_is_cut_off_after_the_grace_period(tmp_path: Path) -> None:
    proc = _start(tmp_path, "hang-sync", 1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) == 130
    assert time.monotonic() - t0 < 15
    assert (tmp_path / "hook").read_text() == "killed"


@pytest.mark.parametrize(("every", "keep", "kept"), [(1, 1, 2), (1, 3, 3), (5, 2, 6)])
def test_weights_back_to_the_last_checkpoint_survive_pruning(every: int, keep: int, kept: int) -> None:
    """An interrupt just after a publish must find the checkpoint's weights on disk to resume."""
    from rollyard.rollout.config import builtin_config
    from rollyard.rollout.orchestrator import weights_to_keep

    cfg = builtin_config("quick", {"run.checkpoint_every": every, "run.keep_weights": keep})
    assert weights_to_keep(cfg) == kept
