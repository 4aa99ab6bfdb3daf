"""The bwrap provider's everyday behaviour: commands, files, limits, cleanup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollyard.core.errors import InvalidRequest, SandboxError
from rollyard.sandbox import Limits, SandboxSpec
from rollyard.sandbox._uids import processes_of
from rollyard.sandbox.bwrap import BwrapProvider


async def test_exec_runs_a_shell_string_in_the_workspace_as_an_unprivileged_user(
    provider: BwrapProvider,
) -> None:
    sb = await provider.create(SandboxSpec())
    try:
        r = await sb.exec("id -u; pwd; echo $HOME; exit 3")
        assert r.rc == 3
        assert r.stdout.split() == ["1000", "/workspace", "/home/sandbox"]
        assert (sb.uid != 0 and os.geteuid() == 0) or sb.uid == os.getuid()
    finally:
        await sb.close()


async def test_exec_passes_spec_and_call_environment_but_not_the_hosts(
    provider: BwrapProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RY_HOST_SECRET", "hunter2")
    sb = await provider.create(SandboxSpec(env={"A": "spec"}))
    try:
        r = await sb.exec(["sh", "-c", 'echo "$A $B ${RY_HOST_SECRET:-unset}"'], env={"B": "call"})
        assert r.stdout.strip() == "spec call unset"
    finally:
        await sb.close()


async def test_files_written_by_the_host_are_visible_inside_and_vice_versa(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec())
    try:
        await sb.write("src/a.txt", "from host")
        r = await sb.exec("cat src/a.txt; echo -n inside > out.txt")
        assert r.stdout == "from host"
        assert await sb.read("out.txt") == b"inside"
        snap = await sb.snapshot()
        assert set(snap) == {"src/a.txt", "out.txt"}
        await sb.write("out.txt", "changed")
        assert (await sb.snapshot())["out.txt"] != snap["out.txt"]
    finally:
        await sb.close()


async def test_workspace_is_copied_from_base_dir_and_upload_adds_a_tree(
    provider: BwrapProvider, tmp_path: Path
) -> None:
    base = tmp_path / "base"
    (base / "pkg").mkdir(parents=True)
    (base / "pkg" / "mod.py").write_text("X = 1\n")
    (base / "run.sh").write_text("#!/bin/sh\necho ran\n")
    os.chmod(base / "run.sh", 0o755)
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "t.txt").write_text("added")
    a = await provider.create(SandboxSpec(base_dir=base))
    b = await provider.create(SandboxSpec(base_dir=base))
    try:
        await a.upload(extra, "more")
        r = await a.exec("./run.sh && cat pkg/mod.py more/t.txt && echo y > pkg/mod.py")
        assert r.stdout == "ran\nX = 1\nadded"
        assert (await b.read("pkg/mod.py")) == b"X = 1\n"  # sandboxes of one base are independent
        assert (base / "pkg" / "mod.py").read_text() == "X = 1\n"
    finally:
        await a.close()
        await b.close()


async def test_tmp_and_home_persist_across_execs_of_one_sandbox_only(provider: BwrapProvider) -> None:
    a = await provider.create(SandboxSpec())
    b = await provider.create(SandboxSpec())
    try:
        await a.exec("echo 1 > /tmp/t && echo 2 > ~/h")
        assert (await a.exec("cat /tmp/t ~/h")).stdout == "1\n2\n"
        assert (await b.exec("cat /tmp/t")).rc != 0
    finally:
        await a.close()
        await b.close()


async def test_close_removes_every_file_and_process_and_is_idempotent(
    provider: BwrapProvider, sandbox_root: Path
) -> None:
    before = sorted(p.name for p in sandbox_root.iterdir())
    sb = await provider.create(SandboxSpec())
    await sb.exec("echo x > f; mkdir -p d/e; chmod 000 d")
    assert sorted(p.name for p in sandbox_root.iterdir()) != before
    await sb.close()
    await sb.close()
    assert sorted(p.name for p in sandbox_root.iterdir()) == before
    assert sb.leaked == 0 and processes_of(sb.uid) == []
    with pytest.raises(SandboxError):
        await sb.exec("true")


async def test_output_is_capped_per_stream_and_flagged(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec(limits=Limits(output_bytes=1000)))
    try:
        r = await sb.exec("head -c 5000 /dev/zero | tr '\\0' a; echo err >&2")
        assert r.rc == 0 and r.truncated
        assert len(r.stdout) == 1000 and r.stderr == "err\n"
    finally:
        await sb.close()


async def test_bad_specs_and_arguments_get_clear_errors(provider: BwrapProvider, tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="base_dir"):
        await provider.create(SandboxSpec(base_dir=tmp_path / "missing"))
    with pytest.raises(SandboxError, match="ro_binds"):
        await provider.create(SandboxSpec(ro_binds=[(tmp_path / "nope", Path("/x"))]))
    with pytest.raises(InvalidRequest, match="absolute"):
        await provider.create(SandboxSpec(rw_binds=[(tmp_path, Path("rel"))]))
    with pytest.raises(InvalidRequest, match="variable name"):
        await provider.create(SandboxSpec(env={"A=B": "x"}))
    sb = await provider.create(SandboxSpec())
    try:
        with pytest.raises(InvalidRequest):
            await sb.exec("true", env={"BAD NAME": "1"})
        with pytest.raises(SandboxError, match="timeout"):
            await sb.exec("true", timeout=0)
        with pytest.raises(SandboxError):
            await sb.exec([])
        with pytest.raises(InvalidRequest):
            await sb.read("../../etc/passwd")
        with pytest.raises(InvalidRequest):
            await sb.write("/etc/passwd", "x")
        with pytest.raises(SandboxError, match="no such file"):
            await sb.read("missing.txt")
    finally:
        await sb.close()


def test_a_missing_bwrap_binary_is_a_clear_error(sandbox_root: Path) -> None:
    with pytest.raises(SandboxError, match="not found"):
        BwrapProvider(sandbox_root, bwrap="bwrap-does-not-exist")


async def test_leftovers_of_a_killed_process_are_collected_and_live_sandboxes_kept(
    provider: BwrapProvider, sandbox_root: Path
) -> None:
    import subprocess
    import sys

    script = (
        "import asyncio, os, signal\n"
        "from pathlib import Path\n"
        "from rollyard.sandbox import BwrapProvider, SandboxSpec\n"
        "async def main():\n"
        f"    sb = await BwrapProvider(Path({str(sandbox_root)!r})).create(SandboxSpec())\n"
        "    print(sb.id, flush=True)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "asyncio.run(main())\n"
    )
    live = await provider.create(SandboxSpec())
    try:
        out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
        sid = out.stdout.strip()
        assert out.returncode == -9 and sid and (sandbox_root / sid).is_dir()
        BwrapProvider(sandbox_root)  # a new provider collects on start
        assert not (sandbox_root / sid).exists()
        assert not any(Path(f"/sys/fs/cgroup/{c}/rollyard/{sid}").exists() for c in ("memory", "pids"))
        assert live.workspace.is_dir() and (await live.exec("true")).rc == 0
    finally:
        await live.close()


async def test_cpu_time_and_file_size_limits_stop_the_offending_command(provider: BwrapProvider) -> None:
    sb = await provider.create(SandboxSpec(limits=Limits(cpu_seconds=1, file_size_mb=1)))
    try:
        spin = await sb.exec("while :; do :; done", timeout=30)
        assert not spin.timed_out and spin.rc != 0  # SIGXCPU, long before the wall clock
        big = await sb.exec("head -c 3000000 /dev/zero > big.bin")
        assert big.rc != 0
        assert len(await sb.read("big.bin")) <= 1024 * 1024
    finally:
        await sb.close()


async def test_leftover_processes_counts_only_processes_no_live_sandbox_owns(provider: BwrapProvider) -> None:
    import asyncio
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("sandbox uids are leased only when running as root")
    before = provider.leftover_processes()  # 0 on a host where nothing leaked before
    sb = await provider.create(SandboxSpec())
    busy = asyncio.ensure_future(sb.exec("sleep 3", timeout=10))
    await asyncio.sleep(0.5)
    assert processes_of(sb.uid) and provider.leftover_processes() == before  # live ones are owned
    stray_uid = sb.uid + 1 if sb.uid + 1 < 1_600_000 else sb.uid - 1
    stray = subprocess.Popen(["sleep", "10"], user=stray_uid, group=stray_uid, extra_groups=[])
    try:
        assert provider.leftover_processes() == before + 1  # the unowned one, not the live sandbox
    finally:
        stray.kill()
        stray.wait()
        await busy
        await sb.close()


def _limits_of(pid: int) -> dict[str, str]:
    rows = Path(f"/proc/{pid}/limits").read_text().splitlines()[1:]
    return {r[:26].strip(): r[26:47].strip() for r in rows}


@pytest.fixture(params=["setpriv+dash", "preexec_fn"])
def confining(request: pytest.FixtureRequest, provider: BwrapProvider) -> BwrapProvider:
    """The provider confining bwrap each way it can: setpriv and dash after a vfork, or a fork
    with a preexec_fn where those are missing."""
    if request.param == "setpriv+dash" and (provider.dash is None or provider.setpriv is None):
        pytest.skip("dash or setpriv is not installed")
    if request.param == "preexec_fn":
        provider.dash = None
    return provider


async def test_bwrap_and_every_process_it_starts_run_inside_the_limits_and_cgroups(
    confining: BwrapProvider,
) -> None:
    import asyncio

    sb = await confining.create(SandboxSpec(limits=Limits(max_processes=40, memory_mb=300, cpu_seconds=7)))
    try:
        inside = await sb.exec("ulimit -u; ulimit -v; ulimit -t; ulimit -f; ulimit -c")
        assert inside.stdout.split() == ["42", str(300 * 1024), "7", str(256 * 1024), "0"]
        if not sb.cgroups:
            return
        busy = asyncio.ensure_future(sb.exec("sleep 5 & sleep 5; wait", timeout=20))
        members: list[str] = []
        for _ in range(100):  # bwrap, bash (the namespace's pid 1, --as-pid-1) and two sleeps
            members = (sb.cgroups[0] / "cgroup.procs").read_text().split()
            if len(members) >= 4:
                break
            await asyncio.sleep(0.05)
        for d in sb.cgroups:
            assert sorted((d / "cgroup.procs").read_text().split()) == sorted(members)
        assert len(members) >= 4
        for pid in members:  # the bwrap processes too, not only what runs inside
            lim = _limits_of(int(pid))
            assert lim["Max processes"] == "42" and lim["Max cpu time"] == "7"
        await sb.close()
        assert (await busy).rc == -9
    finally:
        await sb.close()


async def test_a_sandbox_that_lost_its_cgroup_refuses_to_run_rather_than_run_unconfined(
    confining: BwrapProvider,
) -> None:
    from rollyard.sandbox._cgroup import Cgroups

    sb = await confining.create(SandboxSpec())
    try:
        if not sb.cgroups:
            pytest.skip("no writable cgroups on this host")
        Cgroups.remove(sb.cgroups)
        try:
            r = await sb.exec(["touch", "ran"])
            assert r.rc != 0  # dash stopped before exec'ing bwrap
        except SandboxError as e:  # the preexec_fn failed: Popen raised
            assert "cannot start" in str(e)
        assert not (sb.workspace / "ran").exists() and processes_of(sb.uid) == []
    finally:
        await sb.close()


async def test_commands_start_without_copying_the_host_process_where_setpriv_and_dash_exist(
    provider: BwrapProvider,
) -> None:
    """Popen forks (copying the page tables of this whole process) whenever it must switch uid or
    run a preexec_fn; with neither it uses vfork, whose cost does not grow with the host process."""
    if provider.dash is None or provider.setpriv is None:
        pytest.skip("dash or setpriv is not installed")
    sb = await provider.create(SandboxSpec())
    try:
        assert sb._popen_uid is None and sb._preexec is None
        assert (await sb.exec("id -u")).stdout.strip() == "1000"
    finally:
        await sb.close()
