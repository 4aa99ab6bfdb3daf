"""Two bwrap providers with different lock directories on one host: neither's stale-cgroup
collection touches the other's live sandboxes (issue 45, class 9). A cgroup is collected only
when it is proved dead (no owner holds it), not merely unknown to the collecting provider."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from rollyard.sandbox import SandboxSpec
from rollyard.sandbox._cgroup import CGROUP_ROOT
from rollyard.sandbox.bwrap import BwrapProvider

pytestmark = [
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="per-sandbox cgroups need root"),
]


async def test_a_provider_with_another_lock_dir_leaves_live_sandboxes_cgroups_alone(
    sandbox_root: Path,
) -> None:
    first = BwrapProvider(sandbox_root)
    running = await first.create(SandboxSpec())
    idle = await first.create(SandboxSpec())
    other_root = Path(tempfile.mkdtemp(prefix="ry-sbx-other-"))
    other_locks = Path(tempfile.mkdtemp(prefix="ry-locks-other-"))
    os.chmod(other_root, 0o711)
    dead = None
    try:
        if not running.cgroups:
            pytest.skip("no writable cgroups on this host")
        busy = asyncio.ensure_future(running.exec("sleep 2; echo survived", timeout=30))
        for _ in range(100):
            if first._cgroups is not None and all(
                (d / "cgroup.procs").read_text().split() for d in running.cgroups
            ):
                break
            await asyncio.sleep(0.02)
        # A dead owner's leftover: a group no live provider holds (as a crashed process leaves it).
        dead = [d.parent / "sbx_deadowner0000" for d in running.cgroups]
        for d in dead:
            d.mkdir()
        second = BwrapProvider(other_root, lock_dir=other_locks)  # collects stale sandboxes at start
        second.collect_stale()  # and again, while the first's sandboxes are live
        assert all(d.exists() for d in running.cgroups + idle.cgroups)
        assert not any(d.exists() for d in dead)  # the dead one was still collected
        r = await busy
        assert r.rc == 0 and r.stdout == "survived\n", (r.rc, r.stdout, r.stderr)
        r = await idle.exec("echo hi")
        assert r.rc == 0 and r.stdout == "hi\n", (r.rc, r.stderr)
    finally:
        await running.close()
        await idle.close()
        for d in dead or []:
            if d.exists():
                d.rmdir()
        shutil.rmtree(other_root, ignore_errors=True)
        shutil.rmtree(other_locks, ignore_errors=True)
    assert running.leaked == 0 and idle.leaked == 0
    assert not any(d.exists() for d in running.cgroups + idle.cgroups)
    assert CGROUP_ROOT.exists()
