"""Isolated, clean, cheap workspaces for model-written commands."""

from rollyard.sandbox.base import ExecResult, Limits, Sandbox, SandboxProvider, SandboxSpec
from rollyard.sandbox.bwrap import BwrapProvider, BwrapSandbox
from rollyard.sandbox.hygiene import (
    AccessEvent,
    AccessReport,
    ScrubReport,
    TestAccessMonitor,
    evaluation_sandbox,
    scrub,
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
    "ScrubReport",
    "TestAccessMonitor",
    "Variant",
    "apply",
    "choose",
    "evaluation_sandbox",
    "scrub",
]
