"""Disk quota, seccomp and zombie-free teardown of bwrap sandboxes, tried as an attacker would."""

from __future__ import annotations

import os
import subprocess
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


def zombies_of(parent: int) -> list[str]:
    out = subprocess.run(["ps", "-eo", "pid=,ppid=,stat=,comm="], capture_output=True, text=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return [" ".join(r) for r in rows if r[2].startswith("Z") and int(r[1]) == parent]


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


async def test_exited_and_killed_commands_leave_no_zombies(provider: BwrapProvider) -> None:
    """This process holds no zombie of a sandbox, whether its command exited or was killed.
    (Orphans of bwrap go to the host's init; on hosts whose init does not reap they linger there:
    becoming a child subreaper fixed that but made every orphaned vLLM process a zombie of ours.)"""
    sb = await provider.create(SandboxSpec())
    try:
        for _ in range(5):
            assert (await sb.exec("sleep 0.05 & echo hi")).rc == 0
        assert (await sb.exec("sleep 30", timeout=0.5)).timed_out
    finally:
        await sb.close()
    assert zombies_of(os.getpid()) == []
