"""No sandbox exec leaves a zombie on any host, also where the host's init never reaps (issue 45,
class 8). Each exec's bwrap used to exit on its init's report, racing that init's own exit: the
init (the namespace's pid 1) was then orphaned and became a zombie of the host's init, which here
reaps it at once, so a plain /proc scan afterwards cannot see it. The check runs the sandbox in a
child process that is a child subreaper and never reaps what it adopts, as a container's init
that does not reap would: every orphan of the run stays its zombie, where the scan counts it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")

RUN = r"""
import asyncio, ctypes, json, os, sys, time
from pathlib import Path
from rollyard.sandbox import SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider

ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come here, unreaped

def zombies_here():
    me, out = os.getpid(), []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{e.name}/stat").read_bytes()
        except OSError:
            continue
        head, fields = stat[: stat.rindex(b")")], stat[stat.rindex(b")") + 2 :].split()
        if fields[0] == b"Z" and int(fields[1]) == me:
            out.append((int(e.name), head.split(b"(", 1)[1].decode()))
    return out

async def main(n):
    provider = BwrapProvider(Path(sys.argv[1]))
    sb = await provider.create(SandboxSpec())
    rcs = []
    try:
        for _ in range(n):
            rcs.append((await sb.exec("echo hi")).rc)
        for _ in range(2):
            rcs.append((await sb.exec("sleep 30", timeout=0.3)).rc)
        busy = asyncio.ensure_future(sb.exec("sleep 30", timeout=30))
        await asyncio.sleep(0.3)
    finally:
        await sb.close()
    rcs.append((await busy).rc)
    time.sleep(0.3)  # an orphan's exit lands
    print(json.dumps({"rcs": rcs, "zombies": zombies_here()}))

asyncio.run(main(int(sys.argv[2])))
"""


def test_execs_leave_no_zombie_even_where_the_init_never_reaps(sandbox_root: Path) -> None:
    n = 20
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": src}
    out = subprocess.run(
        [sys.executable, "-c", RUN, str(sandbox_root), str(n)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["rcs"] == [0] * n + [-9, -9, -9], report["rcs"]
    assert report["zombies"] == [], report["zombies"]
