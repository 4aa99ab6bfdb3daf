"""The network of a sandbox whose spec asks for one: outbound access without the host's loopback.

Sharing the host's network namespace (bwrap ``--share-net``) let a sandboxed command reach every
service bound to the host's 127.0.0.1 (the gateway's TCP port, the engines' HTTP ports) and the
host's abstract unix sockets. Instead each networked sandbox gets a network namespace of its own,
created once per sandbox and held by an open file descriptor of the provider's process, whose only
way out is ``slirp4netns``: a user-mode TCP/IP stack that forwards the sandbox's connections as
ordinary sockets of the host, with ``--disable-host-loopback`` refusing the host's loopback
(10.0.2.2). Every exec joins that namespace (``nsenter``, as root, before the uid switch) and bwrap
keeps it (``--share-net``); the namespace belongs to the host's user namespace, so nothing inside
(a child user namespace with no capabilities) can reconfigure it. slirp4netns runs with its own
sandbox and seccomp filter, and exits when the provider's process closes its exit fd or dies.
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import subprocess

from rollyard.core.errors import SandboxError

TAP = "tap0"
DNS = "10.0.2.3"  # slirp4netns's built-in DNS forwarder (its defaults: 10.0.2.0/24, gateway .2)
RESOLV_CONF = f"nameserver {DNS}\n"
_READY_TIMEOUT_S = 10.0


def _tools() -> tuple[str, str, str]:
    """slirp4netns, unshare and nsenter, or a ``SandboxError`` naming what is missing."""
    found = {name: shutil.which(name) for name in ("slirp4netns", "unshare", "nsenter")}
    missing = [name for name, path in found.items() if path is None]
    if missing:
        raise SandboxError(
            f"network: true needs {', '.join(missing)} (`apt-get install -y slirp4netns util-linux`); "
            "a networked sandbox never falls back to the host's network"
        )
    if os.geteuid() != 0:
        raise SandboxError("network: true needs root (its network namespace is made and joined as root)")
    return found["slirp4netns"], found["unshare"], found["nsenter"]  # type: ignore[return-value]


class UserNet:
    """One sandbox's network namespace and the slirp4netns process that is its only way out."""

    def __init__(self) -> None:
        slirp, unshare, self._nsenter = _tools()
        self.netns_fd = self._new_namespace(unshare)
        exit_r, self._exit_w = os.pipe()
        ready_r, ready_w = os.pipe()
        argv = [
            slirp,
            "--configure",
            "--mtu=65520",
            "--disable-host-loopback",
            "--enable-sandbox",
            "--enable-seccomp",
            f"--ready-fd={ready_w}",
            f"--exit-fd={exit_r}",
            "--netns-type=path",
            self._path(),
            TAP,
        ]
        try:
            self._slirp: subprocess.Popen[bytes] | None = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(ready_w, exit_r),
                start_new_session=True,
            )
        except OSError as e:
            self.close()
            raise SandboxError(f"cannot start slirp4netns: {e}") from e
        finally:
            os.close(exit_r)
            os.close(ready_w)
        try:
            ready, _, _ = select.select([ready_r], [], [], _READY_TIMEOUT_S)
            ok = bool(ready) and os.read(ready_r, 1) == b"1"
        finally:
            os.close(ready_r)
        if not ok:
            self.close()
            raise SandboxError("slirp4netns did not bring the sandbox's network up")

    @staticmethod
    def _new_namespace(unshare: str) -> int:
        """A new network namespace, held by an fd: a short-lived holder process makes it, and is
        still our unreaped child (so its pid cannot be reused) when its namespace is opened."""
        holder = subprocess.Popen(
            [unshare, "--net", "--", "sh", "-c", "echo; read x"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        assert holder.stdin is not None and holder.stdout is not None
        try:
            if holder.stdout.readline() != b"\n":
                raise SandboxError("cannot create a network namespace (unshare --net failed)")
            fd = os.open(f"/proc/{holder.pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        finally:
            holder.stdin.close()
            holder.stdout.close()
            holder.wait()
        if os.fstat(fd).st_ino == os.stat("/proc/self/ns/net").st_ino:  # never hand out the host's
            os.close(fd)
            raise SandboxError("the new network namespace is the host's; refusing it")
        return fd

    def _path(self) -> str:
        # Through our own fd table: root may open it, and no fd is passed down to the sandbox.
        return f"/proc/{os.getpid()}/fd/{self.netns_fd}"

    def enter(self) -> list[str]:
        """The argv prefix that runs the rest of a command line inside this namespace."""
        if self.netns_fd < 0:
            raise SandboxError("the sandbox's network is closed")
        return [self._nsenter, f"--net={self._path()}", "--"]

    def close(self) -> int:
        """Stop slirp4netns and drop the namespace; 1 if slirp4netns outlived its kill, else 0."""
        left = 0
        if self._exit_w >= 0:
            os.close(self._exit_w)  # slirp4netns exits when this closes
            self._exit_w = -1
        slirp, self._slirp = getattr(self, "_slirp", None), None
        if slirp is not None:
            try:
                slirp.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                slirp.kill()
                try:
                    slirp.wait(timeout=2.0)
                except subprocess.TimeoutExpired:
                    left = 1
        if self.netns_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.netns_fd)
            self.netns_fd = -1
        return left
