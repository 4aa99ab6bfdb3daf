"""What one simulation returns: the run's summary, its statistics and (when recorded) every
scheduling decision, apart from the loop that produces it so reports need not import the loop."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollyard.sim.stats import SimStats

__all__ = ["SimResult"]


@dataclass
class SimResult:
    workload: str
    policy: str
    profile: str
    engines: int
    summary: dict[str, Any]
    stats: SimStats
    decisions: list[tuple[float, Any]] = field(default_factory=list)
