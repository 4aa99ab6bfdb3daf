"""Per-program environments (ROLL's hygiene and diversity lessons), switched on from the config.

``sandbox.monitor_tests``: decoy test directories are bound into each program's sandbox and
test-like files are watched (``rollyard.sandbox.hygiene.TestAccessMonitor``); what the agent
touched becomes ``TEST_ACCESS`` events and the step's ``count_test_access`` metric.
``tasks.perturb``: with probability ``prob`` a program's environment is broken on purpose by one
perturbation from the catalogue (``rollyard.sandbox.perturb``), recorded as a ``PERTURBATION``
event. Both change the sandbox spec per program, so such programs get their own sandbox from the
provider rather than a task's shared, prepared-ahead one.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import shutil
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from rollyard.core.events import Event, PerturbationEvent, TestAccessEvent
from rollyard.core.program import Program
from rollyard.sandbox.base import Sandbox, SandboxProvider, SandboxSpec
from rollyard.sandbox.hygiene import TestAccessMonitor
from rollyard.sandbox.perturb import Perturbation, PerturbationRecord, apply
from rollyard.tasks.model import Task
from rollyard.tasks.sandboxing import set_up


@dataclass
class ProgramEnvironment:
    """How each program's sandbox differs from its task's plain one."""

    provider: SandboxProvider
    monitor_tests: bool = False
    perturb_prob: float = 0.0
    catalogue: list[Perturbation] = field(default_factory=list)
    seed: int = 0

    @property
    def active(self) -> bool:
        return self.monitor_tests or (self.perturb_prob > 0 and bool(self.catalogue))

    def perturbation(self, program_id: str) -> PerturbationRecord | None:
        """Whether and how this program's environment is broken: a pure function of the run's seed
        and the program id, so a replay makes the same choice."""
        digest = hashlib.sha256(f"{self.seed}:{program_id}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        if not self.catalogue or rng.random() >= self.perturb_prob:
            return None
        return PerturbationRecord(seed=self.seed, perturbations=[rng.choice(self.catalogue)])

    @contextlib.asynccontextmanager
    async def sandbox(
        self, task: Task, program: Program, spec: SandboxSpec, events: list[Event], at: float
    ) -> AsyncIterator[tuple[Sandbox, TestAccessMonitor | None]]:
        """The program's own sandbox, set up; its perturbation is recorded in ``events``."""
        record = self.perturbation(program.id)
        if record is not None:
            spec = apply(spec, record)
            for p in record.perturbations:
                detail = {k: v for k, v in p.model_dump().items() if k != "kind" and v}
                events.append(Event.of(PerturbationEvent(name=p.kind, detail=detail), at=at))
        # Decoys live under /tmp: the sandbox user must traverse every directory above them,
        # which a run directory (often 0700) does not allow.
        root = Path(tempfile.mkdtemp(prefix="ry-decoys-")) if self.monitor_tests else None
        monitor = None
        try:
            if root is not None:
                root.chmod(0o755)
                monitor = TestAccessMonitor(root)
            if monitor is not None:
                spec = monitor.spec(spec)
            sb = await self.provider.create(spec.model_copy(update={"label": program.id}))
            try:
                await set_up(task, sb)
                if monitor is not None:
                    await monitor.arm(sb)
                yield sb, monitor
            finally:
                await sb.close()
        finally:
            if monitor is not None:
                monitor.close()
            if root is not None:
                shutil.rmtree(root, ignore_errors=True)


async def access_events(monitor: TestAccessMonitor | None, sb: Sandbox, at: float) -> list[Event]:
    """What the agent touched of the decoys and the workspace's test-like files."""
    if monitor is None:
        return []
    report = await monitor.check(sb)
    return [Event.of(TestAccessEvent(path=e.path, how=e.kind, where=e.where), at=at) for e in report.events]
