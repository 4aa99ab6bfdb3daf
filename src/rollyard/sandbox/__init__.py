"""Isolated, clean, cheap workspaces for model-written commands.

- ``BwrapProvider`` (default): every ``exec`` is one bubblewrap run in fresh user/pid/net/ipc/uts/
  cgroup/mount namespaces, as uid 1000 inside and a leased unprivileged host uid outside (so
  RLIMIT_NPROC binds even when the host user is root); rlimits and, where writable, per-sandbox
  cgroup v1 memory/pids groups are applied in the forked child before bwrap starts. The
  workspace, /tmp and home are host directories that persist across execs of one sandbox;
  processes never do (the pid namespace dies with the command). Workspaces are copies of
  ``spec.base_dir`` (no overlay: bwrap 0.8 has none).
- ``LocalProvider``: no isolation, explicit ``unsafe=True`` only; the benchmark's baseline.
- ``SandboxPool``: prepared sandboxes per task ahead of demand, bound to programs, destroyed by
  ``on_program_terminated`` or a deadline; metrics in a prometheus registry.
- ``hygiene``: detect access to tests with decoys + access times (see that module for why this
  method); the run's ``sandbox.monitor_tests``.
- ``perturb``: seeded variants and perturbations as a recorded, pure spec transformation.
"""

from rollyard.sandbox.base import ExecResult, Limits, Sandbox, SandboxProvider, SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider, BwrapSandbox
from rollyard.sandbox.hygiene import (
    AccessEvent,
    AccessReport,
    TestAccessMonitor,
)
from rollyard.sandbox.local import LocalProvider, LocalSandbox
from rollyard.sandbox.perturb import Perturbation, PerturbationRecord, Variant, apply, choose
from rollyard.sandbox.pool import PoolStats, SandboxPool

__all__ = [
    "AccessEvent",
    "AccessReport",
    "BwrapProvider",
    "BwrapSandbox",
    "ExecResult",
    "Limits",
    "LocalProvider",
    "LocalSandbox",
    "Perturbation",
    "PerturbationRecord",
    "PoolStats",
    "Sandbox",
    "SandboxPool",
    "SandboxProvider",
    "SandboxSpec",
    "TestAccessMonitor",
    "Variant",
    "apply",
    "choose",
]
