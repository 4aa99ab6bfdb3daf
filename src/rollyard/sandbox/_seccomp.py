"""The sandbox's seccomp filter: a classic-BPF program generated here, loaded by ``bwrap --seccomp``.

Why generated, not libseccomp: Debian's ``python3-seccomp`` binds only the system Python, and
the filter is small enough to write directly: check the architecture (anything but the
native x86-64 ABI, e.g. i386 ``int 0x80`` or x32 numbers, is refused), then answer ``EPERM``
to each denied system call and allow the rest. Denied: what a model-written command has no
use for and what widens the kernel surface or reaches other processes: debugging other
processes, mounts and namespaces, kernel keyrings, BPF, perf events, userfaultfd, io_uring,
module and kexec loading, clock and host settings. Other architectures get no filter (logged).
"""

from __future__ import annotations

import errno
import logging
import os
import platform
import struct
import threading
from pathlib import Path

log = logging.getLogger(__name__)

AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000

# x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
DENIED_X86_64 = {
    "uselib": 134,
    "ptrace": 101,
    "syslog": 103,
    "vhangup": 153,
    "pivot_root": 155,
    "_sysctl": 156,
    "adjtimex": 159,
    "chroot": 161,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "sethostname": 170,
    "setdomainname": 171,
    "iopl": 172,
    "ioperm": 173,
    "create_module": 174,
    "init_module": 175,
    "delete_module": 176,
    "get_kernel_syms": 177,
    "query_module": 178,
    "quotactl": 179,
    "nfsservctl": 180,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "fanotify_init": 300,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}

# classic BPF opcodes
_LD_W_ABS = 0x20
_JEQ_K = 0x15
_JGE_K = 0x35
_RET_K = 0x06
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_RET_KILL_PROCESS = 0x80000000
_NR, _ARCH = 0, 4  # offsets in struct seccomp_data


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def build_filter(denied: dict[str, int] | None = None, machine: str | None = None) -> bytes | None:
    """The BPF program (``struct sock_filter[]`` bytes), or None where no filter is defined."""
    if (machine or platform.machine()) not in ("x86_64", "AMD64"):
        return None
    nrs = sorted(set((denied or DENIED_X86_64).values()))
    n = len(nrs)
    # 0 ld arch; 1 jeq native ? next : kill; 2 kill; 3 ld nr; 4 jge x32 ? errno; 5.. jeq nr ? errno;
    # 5+n allow; 6+n errno
    errno_at = 6 + n
    prog = [
        _insn(_LD_W_ABS, 0, 0, _ARCH),
        _insn(_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
        _insn(_RET_K, 0, 0, _RET_KILL_PROCESS),
        _insn(_LD_W_ABS, 0, 0, _NR),
        _insn(_JGE_K, errno_at - 5, 0, X32_SYSCALL_BIT),
    ]
    for i, nr in enumerate(nrs):
        prog.append(_insn(_JEQ_K, errno_at - (5 + i + 1), 0, nr))
    prog.append(_insn(_RET_K, 0, 0, _RET_ALLOW))
    prog.append(_insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM))
    if errno_at > 255 + 5:
        raise ValueError("too many denied system calls for 8-bit jumps")
    return b"".join(prog)


def write_filter(directory: Path) -> Path | None:
    """Write the filter once per provider (write, then rename); None where none is defined."""
    prog = build_filter()
    if prog is None:
        log.warning("no seccomp filter for %s: sandboxes run without one", platform.machine())
        return None
    path = directory / ".etc-seccomp.bpf"  # beside the shared /etc: a host file of the provider
    tmp = directory / f".etc-seccomp-{os.getpid()}-{threading.get_ident()}.tmp"
    tmp.write_bytes(prog)
    os.replace(tmp, path)
    return path
