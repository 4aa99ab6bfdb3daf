"""Two Ray nodes on one host, each in a network namespace of its own (the multi-node test and bench).

``unshare -Urn`` gives an unprivileged user + network namespace (the head node's); inside it a
child ``unshare -n`` holds a second network namespace (the worker node's), and a veth pair
joins them with private addresses that exist only in there (``HEAD_IP``, ``WORKER_IP``). As
root, the namespaces are network-only (``unshare -n``): the bwrap provider runs each sandbox
as a leased uid, which a one-uid user namespace does not map (its cgroup ``chown`` failed with
EINVAL there); an unprivileged user gets the user namespace, sandboxes then run as that user. The
filesystem stays shared, as a cluster's shared filesystem would be. ``TwoNodeRay`` starts a Ray
head (no CPUs: nothing is placed there) and a Ray worker node, and runs commands on either node
(``nsenter`` into its namespaces). ``kill_worker`` SIGKILLs every process of the worker node,
as a lost machine would go; ``start_worker`` brings it back.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from rollyard.core.errors import ConfigError

Node = Literal["head", "worker"]
HEAD_IP = "10.77.0.1"
WORKER_IP = "10.77.0.2"
RAY_PORT = 6390

# Runs as "root" of the new user namespace, in the head's network namespace.
_PLUMB = f"""
set -e
unshare -n sleep infinity </dev/null >/dev/null 2>&1 &
W=$!
# until the child has entered its own network namespace (a fixed sleep raced on a loaded host)
i=0
while [ "$(readlink /proc/$W/ns/net)" = "$(readlink /proc/$$/ns/net)" ]; do
  i=$((i+1)); [ $i -lt 500 ] || exit 1; sleep 0.01
done
ip link add ry-head type veth peer name ry-worker
ip link set ry-worker netns $W
ip addr add {HEAD_IP}/24 dev ry-head
ip link set ry-head up
ip link set lo up
nsenter -t $W -n ip addr add {WORKER_IP}/24 dev ry-worker
nsenter -t $W -n ip link set ry-worker up
nsenter -t $W -n ip link set lo up
echo "ready $$ $W"
wait
"""


def _net_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


class NetnsPair:
    """The two namespaces and the veth pair between them; ``close`` removes them."""

    def __init__(self) -> None:
        if not (shutil.which("unshare") and shutil.which("nsenter") and shutil.which("ip")):
            raise ConfigError("two namespaced nodes need util-linux's unshare and nsenter and iproute2's ip")
        self.user_ns = os.geteuid() != 0
        self.root = subprocess.Popen(
            ["unshare", "-Urn" if self.user_ns else "-n", "--fork", "sh", "-c", _PLUMB],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        assert self.root.stdout is not None
        # the holder's pipes are not the sleeper's (redirected), so a failed step ends the read
        # at EOF; the deadline covers a step that hangs
        ready, _, _ = select.select([self.root.stdout], [], [], 30.0)
        line = self.root.stdout.readline().decode().split() if ready else ["timed", "out"]
        if line[:1] != ["ready"]:
            self.close()
            err = self.root.stderr.read().decode() if self.root.stderr else ""
            raise ConfigError(f"could not create the two network namespaces: {err.strip() or line}")
        self.pids: dict[Node, int] = {"head": int(line[1]), "worker": int(line[2])}
        self._ns = {node: _net_ns(pid) for node, pid in self.pids.items()}

    def argv(self, node: Node, argv: list[str]) -> list[str]:
        """``argv`` run inside ``node``'s namespaces."""
        if self.user_ns:
            return ["nsenter", "-t", str(self.pids[node]), "-U", "-n", "--preserve-credentials", *argv]
        return ["nsenter", "-t", str(self.pids[node]), "-n", *argv]

    def processes(self, node: Node) -> list[int]:
        """Every process in ``node``'s network namespace and their descendants (a sandbox has a
        namespace of its own), except the ones that hold the namespaces open."""
        keep = {self.root.pid, *self.pids.values()}
        parent: dict[int, int] = {}
        found: set[int] = set()
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            pid = int(entry.name)
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{pid}/stat").read_bytes()
                parent[pid] = int(stat[stat.rindex(b")") + 2 :].split()[1])
            if pid not in keep and _net_ns(pid) == self._ns[node]:
                found.add(pid)
        while more := {p for p, pp in parent.items() if pp in found and p not in found | keep}:
            found |= more  # children of what was found, until nothing new turns up
        return sorted(found)

    def kill(self, node: Node, timeout_s: float = 10.0) -> None:
        """SIGKILL every process of ``node`` (until none is left or ``timeout_s`` passes)."""
        deadline = time.monotonic() + timeout_s
        while (pids := self.processes(node)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)

    def close(self) -> None:
        if getattr(self, "pids", None):
            self.kill("worker")
            self.kill("head")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.root.pid, signal.SIGKILL)
        self.root.wait()


class TwoNodeRay:
    """A Ray head in one namespace and a Ray worker node (``worker_cpus``) in the other.

    The cluster uses token authentication with a token of its own (in its temp dir), which
    every command run through ``popen`` / ``run`` is given. A context manager."""

    def __init__(self, worker_cpus: float = 2) -> None:
        self.worker_cpus = worker_cpus
        # Ray's socket paths must stay under 107 bytes: a short directory under /tmp
        self.tmp = Path(tempfile.mkdtemp(prefix="ryns-", dir="/tmp"))
        self.token = self.tmp / "ray-token"
        self.token.write_text(secrets.token_hex(32))
        self.token.chmod(0o600)
        self.ray = str(Path(sys.executable).parent / "ray")
        self.net: NetnsPair | None = None

    @property
    def address(self) -> str:
        return f"{HEAD_IP}:{RAY_PORT}"

    def env(self) -> dict[str, str]:
        return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(self.token)}

    def popen(self, node: Node, argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        assert self.net is not None
        return subprocess.Popen(self.net.argv(node, argv), env={**self.env(), **kw.pop("env", {})}, **kw)

    def run(self, node: Node, argv: list[str], timeout_s: float = 120.0) -> str:
        """Run ``argv`` on ``node`` to its end; its output, or ``ConfigError`` with it."""
        assert self.net is not None
        p = subprocess.run(
            self.net.argv(node, argv), env=self.env(), capture_output=True, text=True, timeout=timeout_s
        )
        if p.returncode != 0:
            raise ConfigError(
                f"{' '.join(argv[:3])} on the {node} node failed:\n{(p.stdout + p.stderr)[-2000:]}"
            )
        return p.stdout

    def start(self) -> TwoNodeRay:
        self.net = NetnsPair()
        try:
            head = str(self.tmp / "head")
            self.run("head", [self.ray, "start", "--head", "--node-ip-address", HEAD_IP,
                              "--port", str(RAY_PORT), "--num-cpus", "0", "--temp-dir", head,
                              "--include-dashboard", "false", "--disable-usage-stats"])  # fmt: skip
            self.start_worker()
        except BaseException:
            self.close()
            raise
        return self

    def start_worker(self) -> None:
        """(Re)join the worker node to the cluster."""
        self.run("worker", [self.ray, "start", "--address", self.address, "--node-ip-address", WORKER_IP,
                            "--num-cpus", str(self.worker_cpus), "--temp-dir", str(self.tmp / "worker"),
                            "--disable-usage-stats"])  # fmt: skip

    def kill_worker(self) -> None:
        """The worker machine goes: every process on it (raylet, actors, engines, sandboxes) SIGKILLed."""
        assert self.net is not None
        self.net.kill("worker")

    def close(self) -> None:
        if self.net is not None:
            self.net.close()
            self.net = None
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> TwoNodeRay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
