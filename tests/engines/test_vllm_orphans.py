"""Stopping an engine whose API server was killed with SIGKILL ends its whole process group,
EngineCore and workers included (issue 45, class 11): the stop used to see only the dead leader,
report the engine stopped and leave ~1.8 GB of engine running."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

import pytest

from rollyard.engines.launcher import VLLMServer

pytestmark = [pytest.mark.engine]


def live_members(pgid: int) -> list[tuple[int, str]]:
    """(pid, name) of every live process in group ``pgid`` (an independent /proc scan)."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        name = stat[stat.index(b"(") + 1 : stat.rindex(b")")].decode(errors="replace")
        state, _ppid, pgrp = stat[stat.rindex(b")") + 2 :].split()[:3]
        if state != b"Z" and int(pgrp) == pgid:
            out.append((int(pid), name))
    return out


def test_stop_after_kill_9_of_the_api_server_ends_the_whole_group(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    server = VLLMServer(tiny_model_dir, kv_tokens=4096, max_model_len=1024, log_path=tmp_path / "vllm.log")
    server.start()
    assert server.proc is not None
    pgid = server.proc.pid
    try:
        before = live_members(pgid)
        assert len(before) >= 2, before  # the API server and its EngineCore at least
        os.kill(server.proc.pid, signal.SIGKILL)
        server.proc.wait()
        time.sleep(1.0)
        orphans = live_members(pgid)
        assert orphans, "nothing outlived the API server: the case under test did not arise"
        server.stop(timeout_s=10)
        left = live_members(pgid)
        assert left == [], f"processes of the engine's group survived the stop: {left}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
