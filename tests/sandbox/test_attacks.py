"""Attacks really attempted from inside a sandbox; each must be contained, the host and a
neighbouring sandbox unaffected, and no process left behind."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollyard.core.errors import SandboxError
from rollyard.sandbox import Limits, SandboxSpec
from rollyard.sandbox._uids import processes_of
from rollyard.sandbox.bwrap import BwrapProvider, BwrapSandbox

TIGHT = Limits(max_processes=32, memory_mb=256, wall_seconds=5, output_bytes=4096, cpu_seconds=5)


@pytest.fixture
async def pair(provider: BwrapProvider) -> AsyncIterator[tuple[BwrapSandbox, BwrapSandbox]]:
    """An attacker and its neighbour; both must be clean after close."""
    a = await provider.create(SandboxSpec(limits=TIGHT))
    b = await provider.create(SandboxSpec(limits=TIGHT))
    await b.write("secret.txt", "neighbour-secret")
    yield a, b
    await a.close()
    await b.close()
    assert a.leaked == 0 and b.leaked == 0
    assert processes_of(a.uid) == [] and processes_of(b.uid) == []


async def _neighbour_fine(b: BwrapSandbox) -> None:
    r = await b.exec("cat secret.txt", timeout=10)
    assert (r.rc, r.stdout) == (0, "neighbour-secret")


async def test_no_host_port_or_outside_address_is_reachable(pair: tuple[BwrapSandbox, BwrapSandbox]) -> None:
    a, _ = pair
    hits: list[int] = []

    def on_conn(_r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        hits.append(1)
        w.close()

    server = await asyncio.start_server(on_conn, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        t0 = time.monotonic()
        local = await a.exec(f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo connected", timeout=5)
        remote = await a.exec("exec 3<>/dev/tcp/10.0.0.1/80 && echo connected", timeout=5)
        ifaces = await a.exec("ls /sys/class/net 2>/dev/null || cat /proc/net/dev")
        assert time.monotonic() - t0 < 4  # refused/unreachable at once, not a hanging connect
        assert local.rc != 0 and "connected" not in local.stdout
        assert remote.rc != 0 and "unreachable" in remote.stderr.lower()
        assert "eth" not in ifaces.stdout and "ens" not in ifaces.stdout
        assert hits == []
    finally:
        server.close()


async def test_host_files_and_other_sandboxes_cannot_be_read(
    pair: tuple[BwrapSandbox, BwrapSandbox],
) -> None:
    a, b = pair
    r = await a.exec(
        f"cat /etc/shadow; ls /root; cat {b.workspace}/secret.txt; cat {b.dir}/ws/secret.txt;"
        " ls /proc/1/root/; grep -rs neighbour-secret /tmp /home /etc /run /dev /workspace | head -1; true"
    )
    assert "root:" not in r.stdout
    assert "neighbour-secret" not in r.stdout
    assert "No such file" in r.stderr
    await _neighbour_fine(b)


async def test_writes_outside_the_workspace_fail_or_stay_private(
    pair: tuple[BwrapSandbox, BwrapSandbox], tmp_path: Path
) -> None:
    a, b = pair
    marker = f"ry-escape-{os.getpid()}"
    r = await a.exec(
        f"echo x > /usr/bin/{marker}; echo x > /etc/{marker}; echo x > /{marker}; "
        f"echo x > /tmp/{marker}; echo x > {b.workspace}/pwned; echo x > {tmp_path}/pwned; true"
    )
    assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr
    for host_path in (f"/usr/bin/{marker}", f"/etc/{marker}", f"/{marker}", f"/tmp/{marker}"):
        assert not os.path.exists(host_path)
    assert not (b.workspace / "pwned").exists() and not (tmp_path / "pwned").exists()
    await _neighbour_fine(b)


async def test_a_fork_bomb_is_capped_and_killed_without_touching_the_neighbour(
    pair: tuple[BwrapSandbox, BwrapSandbox],
) -> None:
    a, b = pair
    bomb = asyncio.ensure_future(a.exec("bomb() { bomb | bomb & }; bomb; sleep 10", timeout=2.5))
    await asyncio.sleep(1.0)
    assert len(processes_of(a.uid)) <= TIGHT.max_processes + 2
    await _neighbour_fine(b)  # the neighbour still forks and runs
    r = await bomb
    assert r.timed_out
    assert processes_of(a.uid) == []  # the whole tree died with the deadline


async def test_a_memory_bomb_fails_inside_and_the_host_is_unaffected(
    pair: tuple[BwrapSandbox, BwrapSandbox],
) -> None:
    a, b = pair
    r = await a.exec(
        ["python3", "-c", "x = []\nwhile True: x.append(bytearray(16 * 1024 * 1024))"], timeout=10
    )
    assert r.rc != 0 and "MemoryError" in r.stderr
    assert not r.timed_out
    await _neighbour_fine(b)


async def test_endless_output_is_cut_and_the_command_stopped(pair: tuple[BwrapSandbox, BwrapSandbox]) -> None:
    a, b = pair
    t0 = time.monotonic()
    r = await a.exec("yes pwned", timeout=4)
    assert r.truncated and len(r.stdout) == TIGHT.output_bytes
    assert r.rc != 0 and time.monotonic() - t0 < 4
    await _neighbour_fine(b)


async def test_sleeping_past_the_deadline_kills_the_whole_tree(
    pair: tuple[BwrapSandbox, BwrapSandbox],
) -> None:
    a, _ = pair
    t0 = time.monotonic()
    r = await a.exec("setsid sleep 30 & nohup sleep 30 & sleep 30", timeout=0.5)
    assert r.timed_out and time.monotonic() - t0 < 3
    assert processes_of(a.uid) == []
    # background work never outlives the command that started it: exec returns only once the
    # command's pid namespace (and so every process started in it) is gone
    r = await a.exec("(sleep 30 > /dev/null 2>&1 &) ; echo started")
    assert r.stdout == "started\n"
    assert processes_of(a.uid) == []


async def test_symlinks_planted_inside_cannot_steer_host_side_file_operations(
    pair: tuple[BwrapSandbox, BwrapSandbox], tmp_path: Path
) -> None:
    a, _ = pair
    victim = tmp_path / "victim.txt"
    victim.write_text("original")
    os.chmod(tmp_path, 0o755)
    await a.exec(
        f"ln -s {victim} link.txt; ln -s {tmp_path} linkdir; mkfifo pipe; mkdir -p t; ln -s {tmp_path} t/up"
    )
    with pytest.raises(SandboxError):
        await a.read("link.txt")
    with pytest.raises(SandboxError):
        await a.write("linkdir/evil.txt", "x")
    await a.write("link.txt", "replaced")  # replaces the link itself
    assert victim.read_text() == "original"
    assert (await a.read("link.txt")) == b"replaced"
    src = tmp_path / "up_src"
    (src / "up").mkdir(parents=True)
    (src / "up" / "evil.txt").write_text("x")
    with pytest.raises(SandboxError):
        await a.upload(src, "t")
    assert not (tmp_path / "evil.txt").exists()
    snap = await asyncio.wait_for(a.snapshot(), 5)  # a fifo must not hang the host
    assert "pipe" not in snap and "link.txt" in snap


async def test_the_sandbox_cannot_create_namespaces_or_gain_privileges(
    pair: tuple[BwrapSandbox, BwrapSandbox],
) -> None:
    a, _ = pair
    r = await a.exec("unshare -Ur true && echo nested; grep CapEff /proc/self/status")
    assert "nested" not in r.stdout
    assert "0000000000000000" in r.stdout


async def test_memory_spread_over_processes_is_capped_for_the_sandbox_as_a_whole(
    provider: BwrapProvider,
) -> None:
    if provider._cgroups is None or "memory" not in provider._cgroups.parents:
        pytest.skip("no writable memory cgroup on this host; only per-process limits apply")
    sb = await provider.create(SandboxSpec(limits=TIGHT))
    hog = (
        'python3 -c \'import time; n = 150 << 20; b = bytearray(n); b[::4096] = b"x" * (n // 4096);'
        ' time.sleep(3); print("survived", flush=True)\' &'
    )
    try:
        # each process stays under its own 256 MB address-space limit; together they would not.
        # Two survivors would have held 2 x 150 MB at the same time (the holds overlap).
        r = await sb.exec(f"for i in 1 2 3 4; do {hog} done; wait", timeout=20)
        assert r.stdout.count("survived") <= 1 and "Killed" in r.stderr, (r.stdout, r.stderr)
    finally:
        await sb.close()
    assert sb.leaked == 0 and not any(d.exists() for d in sb.cgroups)
