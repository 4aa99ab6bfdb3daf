"""Hygiene: scrubbing leftovers, evaluating in a fresh copy, detecting access to tests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollyard.sandbox import SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider
from rollyard.sandbox.hygiene import (
    TestAccessMonitor,
    atime_works,
    evaluation_sandbox,
    is_test_like,
    scrub,
    scrub_plan,
)


def test_scrub_plan_removes_declared_artefacts_and_new_paths_but_keeps_exceptions() -> None:
    base = {"src/a.py": "1", "setup.log": "2", "README": "3"}
    now = {
        **base,
        "src/b.py": "4",  # new file in an old dir
        "node_modules/x/y.js": "5",  # a whole new dir
        "out/keep.txt": "6",
        "src/__pycache__/a.pyc": "7",
    }
    plan = scrub_plan(base, now, remove=["setup.log", "*__pycache__"], keep=["out", "out/*"])
    assert plan == ["node_modules", "setup.log", "src/__pycache__", "src/b.py"]
    assert scrub_plan(now, now) == []


def test_test_like_paths_are_recognised_by_name_and_directory() -> None:
    assert all(map(is_test_like, ["test_x.py", "pkg/tests/data.json", "a/b_test.go", "web/app.spec.ts"]))
    assert not any(map(is_test_like, ["src/main.py", "contest.py", "latest.txt"]))


async def test_scrub_deletes_setup_leftovers_inside_the_sandbox(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec())
    try:
        await sb.write("app.py", "print(1)")
        baseline = await sb.snapshot()
        await sb.exec(
            "mkdir -p .agent/bin && echo x > .agent/bin/tool && echo y > install.log && echo z > app.py"
        )
        report = await scrub(sb, baseline, remove=["*.log"])
        assert report.removed == [".agent", "install.log"]
        assert set(await sb.snapshot()) == {"app.py"}
        assert (await sb.exec("ls -A")).stdout.split() == ["app.py"]
    finally:
        await sb.close()


async def test_evaluation_runs_on_a_fresh_copy_with_tests_the_agent_never_saw(
    provider: BwrapProvider, tmp_path: Path
) -> None:
    tests = tmp_path / "hidden"
    tests.mkdir()
    (tests / "test_answer.sh").write_text("#!/bin/sh\ngrep -q 42 answer.txt\n")
    os.chmod(tests / "test_answer.sh", 0o755)
    agent = await provider.create(SandboxSpec())
    try:
        r = await agent.exec("echo 42 > answer.txt; ls tests /tests 2>&1 | grep -c test_answer; true")
        assert r.stdout.strip() == "0"
        ev = await evaluation_sandbox(provider, agent, tests)
        try:
            assert (await ev.exec("tests/test_answer.sh")).rc == 0
            await ev.exec("echo 0 > answer.txt")
            assert (await agent.read("answer.txt")) == b"42\n"  # the copy is independent
            assert "tests/test_answer.sh" not in await agent.snapshot()
        finally:
            await ev.close()
    finally:
        await agent.close()


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
