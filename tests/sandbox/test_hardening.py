"""Disk quota, seccomp and zombie-free teardown of bwrap sandboxes, tried as an attacker would."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from rollyard.sandbox._seccomp import DENIED_X86_64, build_filter
from rollyard.sandbox.base import Limits, SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider

# Each line: name, number, and the syscall's return value and errno as the sandbox sees them.
PROBE = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
for name, nr in [a.split("=") for a in sys.argv[1:]]:
    r = libc.syscall(int(nr), 0, 0, 0, 0, 0)
    print(name, r, ctypes.get_errno())
"""
TRIED = ["ptrace", "mount", "keyctl", "bpf", "perf_event_open", "userfaultfd", "unshare", "setns"]
TRIED += ["io_uring_setup", "add_key", "kexec_load", "init_module", "process_vm_readv", "open_by_handle_at"]

pytestmark = pytest.mark.skipif(build_filter() is None, reason="no seccomp filter for this architecture")


# Inside the sandbox: a process that is its children's reaper (PR_SET_CHILD_SUBREAPER, as a
# container's init would be) and never waits: two children that exit, and a double fork's middle
# process and its orphan, stay its zombies (4); it reports how many the sandbox's /proc shows,
# then sleeps or exits.
NO_REAP = r"""
import ctypes, os, sys, time
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
for _ in range(2):
    if os.fork() == 0:
        os._exit(0)
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(0.05)
        os._exit(0)
    os._exit(0)
time.sleep(0.3)
stats = [open(f"/proc/{p}/stat").read() for p in os.listdir("/proc") if p.isdigit()]
print(sum(s.rsplit(")", 1)[1].split()[0] == "Z" for s in stats), flush=True)
if sys.argv[1] == "sleep":
    time.sleep(60)
"""


def zombies() -> set[tuple[int, int, int]]:
    """(pid, parent pid, real uid) of every zombie on the host, from /proc/*/stat and status."""
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_bytes()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if fields[0] != b"Z":
                continue
            status = Path(f"/proc/{entry.name}/status").read_text()
        except (OSError, ValueError):
            continue
        uid = int(status.split("Uid:\t", 1)[1].split()[0])
        found.add((int(entry.name), int(fields[1]), uid))
    return found


def new_zombies_of(before: set[tuple[int, int, int]], uid: int) -> list[tuple[int, int, int]]:
    """Zombies that appeared since ``before`` and are this process's children, or ran as the
    sandbox's uid (its host uid when leased, i.e. as root: bwrap, its pid 1, what ran inside),
    wherever they were reparented to (the host's init here does not reap)."""
    me = os.getpid()
    leased = uid != os.getuid()
    return sorted(z for z in zombies() - before if z[1] == me or (leased and z[2] == uid))


async def test_many_files_cannot_exceed_the_sandbox_disk_quota(provider: BwrapProvider) -> None:
    if os.geteuid() != 0:
        pytest.skip("the quota is a tmpfs mount (root)")
    sb = await provider.create(SandboxSpec(limits=Limits(disk_mb=8, file_size_mb=4)))
    try:
        # Each file is under the per-file limit; together, in the workspace and /tmp, far over 8 MB.
        r = await sb.exec(
            "for i in $(seq 1 12); do head -c 1000000 /dev/zero > f$i;"
            " head -c 1000000 /dev/zero > /tmp/t$i; done; du -skc . /tmp | tail -1",
            timeout=30,
        )
        assert "No space left on device" in r.stderr
        assert int(r.stdout.split()[0]) <= 8 * 1024
    finally:
        await sb.close()
    assert sb.leaked == 0 and not sb.dir.exists()
    assert str(sb.dir) not in Path("/proc/mounts").read_text()


async def test_seccomp_denies_kernel_surface_syscalls_and_allows_ordinary_work(
    provider: BwrapProvider,
) -> None:
    args = [f"{n}={DENIED_X86_64[n]}" for n in TRIED]
    on = await provider.create(SandboxSpec())
    off = await provider.create(SandboxSpec(limits=Limits(seccomp=False)))
    try:
        r = await on.exec(["python3", "-c", PROBE, *args, "getpid=39"])
        seen = {
            line.split()[0]: (int(line.split()[1]), int(line.split()[2])) for line in r.stdout.splitlines()
        }
        for name in TRIED:
            assert seen[name] == (-1, 1), (name, seen[name])  # EPERM, from the filter
        assert seen["getpid"][0] > 0
        # Without the filter, ptrace(PTRACE_TRACEME) and unshare(0) succeed: the filter is what denies.
        r = await off.exec(["python3", "-c", PROBE, "ptrace=101", "unshare=272"])
        assert all(line.split()[1] == "0" for line in r.stdout.splitlines()), r.stdout
        r = await on.exec(
            "ls / >/dev/null && python3 -c 'import subprocess; subprocess.run([\"true\"], check=True)'"
        )
        assert r.rc == 0, r.stderr
    finally:
        await on.close()
        await off.close()


async def test_foreign_abi_syscall_numbers_are_refused(provider: BwrapProvider) -> None:
    """An x32-ABI number (bit 30 set) is refused, so the deny list cannot be bypassed that way."""
    sb = await provider.create(SandboxSpec())
    try:
        r = await sb.exec(["python3", "-c", PROBE, f"x32_ptrace={0x40000000 | 101}"])
        assert r.stdout.split()[1:] == ["-1", "1"], r.stdout
    finally:
        await sb.close()


async def test_exited_killed_and_closed_commands_leave_no_zombie_anywhere(provider: BwrapProvider) -> None:
    """No zombie of a sandbox remains, neither this process's nor one reparented to the host's
    init, whether its command exited with background children and a double-fork orphan behind,
    ran past its deadline, or was running when the sandbox closed. (Killing bwrap before its
    namespace's pid 1 left that pid 1 a zombie of the host's init, see ``sandbox/_pidns.py``.)"""
    before = zombies()
    sb = await provider.create(SandboxSpec())
    try:
        for _ in range(3):
            assert (await sb.exec("sleep 0.05 & (sleep 0.05 &) ; echo hi")).stdout == "hi\n"
        for _ in range(3):
            r = await sb.exec("sleep 0.01 & (sleep 0.01 &) ; sleep 30", timeout=0.5)
            assert r.timed_out and r.rc == -9
        busy = asyncio.ensure_future(sb.exec("sleep 0.01 & sleep 30", timeout=30))
        await asyncio.sleep(0.5)
    finally:
        await sb.close()
    assert (await busy).rc == -9
    await asyncio.sleep(0.2)  # a zombie of init appears once --die-with-parent's kill lands
    assert new_zombies_of(before, sb.uid) == []


async def test_a_command_that_never_reaps_its_children_leaves_no_zombie(provider: BwrapProvider) -> None:
    """A command acting as a non-reaping init for its children holds zombies while it runs (the
    sandbox sees them); whether it then exits or is killed at its deadline, none remains after."""
    before = zombies()
    sb = await provider.create(SandboxSpec())
    try:
        r = await sb.exec(["python3", "-c", NO_REAP, "exit"])
        assert r.rc == 0 and int(r.stdout) == 4, (r.stdout, r.stderr)
        r = await sb.exec(["python3", "-c", NO_REAP, "sleep"], timeout=2)
        assert r.timed_out and int(r.stdout) == 4, (r.stdout, r.stderr)
    finally:
        await sb.close()
    await asyncio.sleep(0.2)
    assert new_zombies_of(before, sb.uid) == []
