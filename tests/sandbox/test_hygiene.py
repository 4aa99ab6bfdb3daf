"""Hygiene: detecting access to tests with decoys and access times."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.sandbox import SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider
from rollyard.sandbox.hygiene import (
    TestAccessMonitor,
    atime_works,
    is_test_like,
)


def test_test_like_paths_are_recognised_by_name_and_directory() -> None:
    assert all(map(is_test_like, ["test_x.py", "pkg/tests/data.json", "a/b_test.go", "web/app.spec.ts"]))
    assert not any(map(is_test_like, ["src/main.py", "contest.py", "latest.txt"]))


async def test_reading_decoys_or_workspace_tests_is_reported_and_quiet_agents_are_not(
    provider: BwrapProvider, sandbox_root: Path
) -> None:
    if not atime_works(sandbox_root):
        pytest.skip("this filesystem does not record access times (noatime)")
    mon = TestAccessMonitor(sandbox_root)
    quiet = await provider.create(mon.spec(SandboxSpec()))
    nosy = await provider.create(mon.spec(SandboxSpec()))
    try:
        for sb in (quiet, nosy):
            await sb.write("src/app.py", "x = 1\n")
            await sb.write("tests/test_app.py", "assert True\n")
        await mon.arm(quiet)
        await quiet.exec("cat src/app.py; echo 2 > src/app.py; ls")
        await quiet.snapshot()  # the host's own reads must not count
        report = await mon.check(quiet)
        assert report.method == "atime"
        assert report.events == [] and not report.touched_tests

        await mon.arm(nosy)
        await nosy.exec(
            "ls /tests; cat /hidden_tests/test_hidden.py; cat tests/test_app.py; touch test_new.py"
        )
        report = await mon.check(nosy)
        got = {(e.path, e.kind, e.where) for e in report.events}
        assert ("/tests", "listed", "decoy") in got
        assert ("/hidden_tests/test_hidden.py", "read", "decoy") in got
        assert ("tests/test_app.py", "read", "workspace") in got
        assert ("test_new.py", "created", "workspace") in got
        assert not any(e.path.startswith("/eval") for e in report.events)
        r = await nosy.exec("echo pwned > /tests/test_hidden.py; rm tests/test_app.py")
        assert "Permission denied" in r.stderr  # decoys are readable, never writable
        assert ("tests/test_app.py", "deleted", "workspace") in {
            (e.path, e.kind, e.where) for e in (await mon.check(nosy)).events
        }
    finally:
        await quiet.close()
        await nosy.close()
        mon.close()
