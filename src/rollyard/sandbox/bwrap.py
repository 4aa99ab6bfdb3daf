"""The default provider: Debian bubblewrap namespaces around a per-sandbox host directory.

Each ``exec`` is one bwrap run: new user, pid, ipc, uts, cgroup, mount and network namespaces, a
read-only /usr, a minimal generated /etc, and the sandbox's own workspace, /tmp and home bound
read-write. Because every exec gets a fresh pid namespace, nothing a command starts outlives it;
a killed exec is ended through that namespace's pid 1, not bwrap, so no zombie is left (``_pidns``).
When the host user is root, bwrap itself runs as a leased unprivileged uid (see ``_uids``), so the
process, memory, CPU and file-size rlimits bind even for root.

How a command starts matters for speed: Python forks (copying the page tables of the whole host
process, ~50 ms per exec for a 500 MB process on a loaded 2-core host, with the event loop
blocked meanwhile) whenever Popen must switch uid or run a ``preexec_fn``, and uses the constant
cost ``vfork`` otherwise. So the uid switch is ``setpriv``'s and the cgroup join and rlimits are
one ``dash``'s, each exec'ing the next in place: setpriv -> dash -> bwrap, one pid. Without dash
(or setpriv) a fork with a ``preexec_fn`` does both (``_proc.confine``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from rollyard.core.errors import SandboxError
from rollyard.core.ids import new_id
from rollyard.sandbox import _fs
from rollyard.sandbox._cgroup import Cgroups
from rollyard.sandbox._etc import build_etc
from rollyard.sandbox._host import HostWorkspace, check_env, check_spec
from rollyard.sandbox._net import UserNet
from rollyard.sandbox._pidns import PidNamespace, parent_of
from rollyard.sandbox._proc import confine, dash_confine, run_capped
from rollyard.sandbox._quota import mount_quota
from rollyard.sandbox._seccomp import write_filter
from rollyard.sandbox._uids import (
    UidAllocator,
    UidLease,
    processes_in_range,
    processes_of,
    try_lock,
    unlock,
)
from rollyard.sandbox.base import ExecResult, SandboxSpec

log = logging.getLogger(__name__)

INSIDE_UID = 1000
HOME = "/home/sandbox"
PATH = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
_SYSTEM_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


def default_root() -> Path:
    return Path(tempfile.gettempdir()) / "rollyard-sandboxes"


class BwrapSandbox(HostWorkspace):
    def __init__(self, provider: BwrapProvider, spec: SandboxSpec, sid: str, lease: UidLease | None) -> None:
        self.id = sid
        self.spec = spec
        self._provider = provider
        self._lease = lease
        self.uid = lease.uid if lease else os.getuid()  # host uid its processes run as
        self._owner = (self.uid, self.uid) if lease else None
        self.dir = provider.root / sid
        self.workspace = self.dir / "ws"
        self._closed = False
        self._active = 0  # execs in flight
        self._killed = False  # some exec was killed (deadline, runaway output, cancel)
        self.leaked = 0  # processes or files found after close(); 0 unless something is wrong
        self.cgroups: list[Path] = []  # set by the provider when cgroups are usable
        self._lock_fd = -1  # the provider's liveness lock for this sandbox
        self._prefix: list[str] = []
        self._preexec: Callable[[], None] | None = None  # confines bwrap when dash does not
        self._popen_uid: int | None = None  # the uid Popen switches to (forces a fork)
        self._net: UserNet | None = None  # its network namespace when the spec asks for network

    def _rlimits(self) -> list[tuple[int, int]]:
        lim = self.spec.limits
        return [
            # bwrap's own two processes count against the uid's process limit too.
            (resource.RLIMIT_NPROC, lim.max_processes + 2),
            (resource.RLIMIT_AS, lim.memory_mb * 1024 * 1024),
            (resource.RLIMIT_CPU, lim.cpu_seconds),
            (resource.RLIMIT_FSIZE, lim.file_size_mb * 1024 * 1024),
            (resource.RLIMIT_CORE, 0),
        ]

    def _argv_prefix(self) -> list[str]:
        argv = [*self._provider.base_argv]
        if self.spec.network:  # the sandbox's own namespace, entered by exec (see ``_net``)
            argv.append("--share-net")
        argv += ["--bind", str(self.dir / "tmp"), "/tmp", "--bind", str(self.dir / "home"), HOME]
        argv += ["--bind", str(self.workspace), self.spec.workdir]
        for host, inside in self.spec.ro_binds:
            argv += ["--ro-bind", str(host), str(inside)]
        for host, inside in self.spec.rw_binds:
            argv += ["--bind", str(host), str(inside)]
        argv += ["--chdir", self.spec.workdir]
        base_env = {"PATH": PATH, "HOME": HOME, "USER": "sandbox", "LANG": "C.UTF-8", "TERM": "dumb"}
        for k, v in {**base_env, **self.spec.env}.items():
            argv += ["--setenv", k, v]
        return argv

    async def exec(
        self, cmd: str | list[str], *, timeout: float | None = None, env: dict[str, str] | None = None
    ) -> ExecResult:
        self._check_open()
        if not self._prefix:
            raise SandboxError(f"sandbox {self.id} is not prepared")
        command = ["bash", "-lc", cmd] if isinstance(cmd, str) else list(cmd)
        if not command or not all(isinstance(c, str) and "\x00" not in c for c in command):
            raise SandboxError("command must be a non-empty string or list of strings without NUL")
        env_args = [a for k, v in check_env(env or {}).items() for a in ("--setenv", k, v)]
        limit = self.spec.limits.wall_seconds if timeout is None else timeout
        if limit <= 0:
            raise SandboxError(f"timeout must be positive, got {timeout}")
        info_r, info_w = os.pipe()  # bwrap reports the host pid of the namespace's pid 1 here
        pidns = PidNamespace(info_r)
        fds = [info_w]
        enter = self._net.enter() if self._net is not None else []
        argv = [*enter, *self._prefix, "--info-fd", str(info_w)]
        filt = self._provider.seccomp if self.spec.limits.seccomp else None
        if filt is not None:  # bwrap reads the BPF program from this fd and loads it before exec
            fds.append(os.open(filt, os.O_RDONLY | os.O_CLOEXEC))
            argv += ["--seccomp", str(fds[-1])]
        argv += [*env_args, "--", *command]
        self._active += 1
        try:
            try:
                result = await run_capped(
                    argv,
                    timeout=limit,
                    output_bytes=self.spec.limits.output_bytes,
                    env={"PATH": PATH},
                    cwd="/",
                    user=self._popen_uid,
                    pass_fds=tuple(fds),
                    preexec=self._preexec,
                    pidns=pidns,
                )
            finally:
                for fd in fds:
                    os.close(fd)
            await self._await_namespace_end(pidns)
        finally:
            pidns.close()
            os.close(info_r)
            self._active -= 1
        if result.rc < 0 and self._lease is not None:
            self._killed = True
            await asyncio.to_thread(self._settle)
        if self._closed:
            return result.model_copy(update={"rc": -9})
        return result

    async def _await_namespace_end(self, pidns: PidNamespace) -> None:
        """bwrap has exited; wait for its pid 1 too (it only outlives bwrap when bwrap itself was
        killed). The kernel kills every process of the pid namespace before that pid 1 finishes
        exiting, so once it is gone nothing of this exec runs."""
        if not await pidns.wait_gone(2.0):
            log.warning("sandbox=%s pid namespace still alive 2 s after bwrap exited", self.id)
            self._killed = True  # let close() sweep

    def _settle(self, wait_s: float = 2.0, *, force: bool = False) -> None:
        """After a kill, wait until the killed pid namespace is really gone (the kernel tears it
        down asynchronously), so a caller that counts processes sees none. When no other exec is
        running (or ``force``), whatever still runs under this sandbox's uid is killed: first all
        but the bwraps this process started, so that each reaps its namespace's pid 1 rather than
        leave it a zombie of the host's init (see ``_pidns``); those too after a grace period."""
        start = time.monotonic()
        me = os.getpid()
        while pids := processes_of(self.uid):
            if force or self._active == 0:
                late = time.monotonic() > start + 0.5
                for pid in pids:
                    if late or parent_of(pid) != me:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
            if time.monotonic() > start + wait_s:
                return
            time.sleep(0.01)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.to_thread(self._teardown)

    def _teardown(self) -> None:
        # An exec that ended on its own took its pid namespace with it (the kernel kills every
        # member when the namespace's init exits), so only a running or killed exec needs a sweep.
        if self._lease is not None and (self._active or self._killed):
            self._settle(force=True)  # every process of this uid is ours
            self.leaked = len(processes_of(self.uid))
        if self._net is not None:
            self.leaked += self._net.close()
        if self.cgroups:
            self.leaked += Cgroups.remove(self.cgroups)
        if self._provider._cgroups is not None:
            self._provider._cgroups.release(self.id)
        _fs.remove_tree(self.dir)
        self.leaked += int(self.dir.exists())
        if self._lease is not None:
            self._lease.release()
        if self._lock_fd >= 0:  # last: until here a crash would leave something to collect
            unlock(self._provider.lock_dir / f"{self.id}.lock", self._lock_fd)
            self._lock_fd = -1
        if self.leaked:
            log.error("sandbox=%s leaked=%d", self.id, self.leaked)
        else:
            log.debug("sandbox=%s closed", self.id)


class BwrapProvider:
    """Creates ``BwrapSandbox``es under ``root`` (default: a folder in the system temp dir)."""

    name = "bwrap"

    def __init__(
        self,
        root: Path | None = None,
        *,
        bwrap: str = "bwrap",
        uid_first: int = 1_500_000,
        uid_count: int = 100_000,
        lock_dir: Path | None = None,
        cgroups: bool = True,
    ) -> None:
        found = shutil.which(bwrap)
        if found is None:
            raise SandboxError(f"{bwrap!r} not found; install it with `apt-get install -y bubblewrap`")
        self.bwrap = found
        # Both found: commands start through vfork; else a fork with a preexec_fn confines them.
        self.dash: str | None = shutil.which("dash")
        self.setpriv: str | None = shutil.which("setpriv")
        self.root = Path(root) if root is not None else default_root()
        self.root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.root, 0o711)  # sandbox uids traverse it, nobody lists it
        if os.geteuid() == 0:
            for parent in self.root.resolve().parents:
                if not os.stat(parent).st_mode & 0o001:
                    raise SandboxError(f"sandbox root {self.root}: {parent} is not searchable by others")
        self.etc_dir = build_etc(self.root, INSIDE_UID, HOME)
        self.seccomp = write_filter(self.root)
        self.base_argv = self._base_argv()
        # Every live sandbox holds a lock here (shared by all providers on the host), which is how
        # leftovers of a crashed process are told apart from live sandboxes of another one.
        self.lock_dir = lock_dir or Path(tempfile.gettempdir()) / f"rollyard-locks-{os.geteuid()}"
        self.lock_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._uids: UidAllocator | None = None
        self._cgroups: Cgroups | None = None
        if os.geteuid() == 0:
            self._uids = UidAllocator(self.lock_dir, uid_first, uid_count)
            self._cgroups = Cgroups() if cgroups else None
        else:
            log.info("not root: sandboxes run as uid %d; process limits are per host user", os.getuid())
        self.collect_stale()

    def _base_argv(self) -> list[str]:
        """The part of every sandbox's bwrap command line that only depends on the host; built
        once, since checking the system directories per create showed up in profiles."""
        argv = [
            self.bwrap,
            "--unshare-all",
            "--unshare-user",
            "--as-pid-1",  # bwrap waits for the namespace's pid 1 itself: no orphan (see _pidns)
            "--disable-userns",
            "--uid",
            str(INSIDE_UID),
            "--gid",
            str(INSIDE_UID),
            "--die-with-parent",
            "--new-session",
            "--cap-drop",
            "ALL",
            "--hostname",
            "sandbox",
            "--clearenv",
            "--ro-bind",
            "/usr",
            "/usr",
        ]
        for d in _SYSTEM_DIRS:
            if os.path.islink(d):
                argv += ["--symlink", os.readlink(d), d]
            elif os.path.isdir(d):
                argv += ["--ro-bind", d, d]
        # One bind for the whole minimal /etc (each mount costs ~1 ms of start-up).
        return [*argv, "--proc", "/proc", "--dev", "/dev", "--ro-bind", str(self.etc_dir), "/etc"]

    def _become(self, uid: int) -> list[str] | None:
        """argv prefix doing what Popen's user=, group= and extra_groups=[] would, after a vfork;
        None without setpriv."""
        if self.setpriv is None:
            return None
        return [self.setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]

    def collect_stale(self) -> int:
        """Remove directories (under this root) and cgroups of sandboxes whose owner died without
        closing them (a crash, SIGKILL); their processes died with it (bwrap --die-with-parent).
        A sandbox is dead when its lock here is free and no process holds its cgroups (the owner
        of a live one does, whatever its lock directory: see ``_cgroup``). Returns how many
        directories were removed."""
        names = {p.name for p in self.root.iterdir() if p.name.startswith("sbx_")}
        names |= {p.name[: -len(".lock")] for p in self.lock_dir.glob("sbx_*.lock")}
        parents = list(self._cgroups.parents.values()) if self._cgroups else []
        for parent in parents:
            names |= {p.name for p in parent.iterdir() if p.name.startswith("sbx_")}
        removed = 0
        for name in sorted(names):
            lock = self.lock_dir / f"{name}.lock"
            fd = try_lock(lock)
            if fd is None:
                continue  # a live sandbox
            try:
                groups = [parent / name for parent in parents if (parent / name).exists()]
                held = Cgroups.claim(groups)
                if held is None:
                    continue  # live, owned by a provider with another lock directory
                try:
                    Cgroups.remove(groups)
                finally:
                    for g in held:
                        os.close(g)
                if (self.root / name).exists():
                    _fs.remove_tree(self.root / name)
                    removed += 1
            finally:
                unlock(lock, fd)
        if removed:
            log.warning("removed %d sandboxes left behind by a process that died", removed)
        return removed

    def leftover_processes(self) -> int:
        """Live processes under a sandbox uid of this provider's range that no live sandbox holds
        (its uid lock is free): leaks, from this process or any other using the same lock dir.
        One /proc scan; sandboxes running elsewhere on the host are not counted."""
        if self._uids is None:
            return 0
        by_uid: dict[int, int] = {}
        for uid in processes_in_range(self._uids.first, self._uids.count).values():
            by_uid[uid] = by_uid.get(uid, 0) + 1
        leaked = 0
        for uid, n in by_uid.items():
            path = self.lock_dir / f"uid-{uid}.lock"
            fd = try_lock(path)
            if fd is not None:
                leaked += n
                unlock(path, fd)
        return leaked

    async def create(self, spec: SandboxSpec) -> BwrapSandbox:
        check_spec(spec)
        sid = new_id("sbx")
        lock = try_lock(self.lock_dir / f"{sid}.lock")
        if lock is None:
            raise SandboxError(f"cannot lock a new sandbox id {sid}")
        try:
            lease = self._uids.lease() if self._uids is not None else None
        except BaseException:
            unlock(self.lock_dir / f"{sid}.lock", lock)
            raise
        sandbox = BwrapSandbox(self, spec, sid, lease)
        sandbox._lock_fd = lock
        try:
            await asyncio.to_thread(self._prepare, sandbox)
        except BaseException:
            await sandbox.close()
            raise
        return sandbox

    def _prepare(self, sb: BwrapSandbox) -> None:
        if self._cgroups is not None and self._cgroups.enabled:
            lim = sb.spec.limits
            sb.cgroups = self._cgroups.create(
                sb.id,
                sb.uid,
                memory_bytes=lim.memory_mb * 1024 * 1024,
                max_pids=lim.max_processes + 3,  # + bwrap's two processes and one spare
            )
        procs, lease = Cgroups.procs_files(sb.cgroups), sb._lease
        become = self._become(lease.uid) if lease is not None else []
        if self.dash is not None and become is not None:
            sb._prefix = [*become, *dash_confine(self.dash, sb._rlimits(), procs), *sb._argv_prefix()]
        else:
            sb._prefix = sb._argv_prefix()
            sb._preexec = confine(sb._rlimits(), procs)
            sb._popen_uid = lease.uid if lease is not None else None
        if sb.spec.network:
            if sb._preexec is not None:  # nsenter must run as root, before the uid switch
                raise SandboxError("network: true needs dash and setpriv (to join the network as root)")
            sb._net = UserNet()
        sb.dir.mkdir(mode=0o711)
        mount_quota(sb.dir, sb.spec.limits.disk_mb)  # all of its files together (not per file)
        owner = sb._owner
        for sub in ("ws", "tmp", "home"):
            (sb.dir / sub).mkdir(mode=0o700)
            if owner is not None:
                os.chown(sb.dir / sub, *owner)
        if sb.spec.base_dir is not None:
            _fs.copy_tree(sb.spec.base_dir, sb.workspace, owner=owner)
