"""Per-group figures the step's metrics row is built from: reward terms and event counts.

Counts add up across a step's groups (``sum_stats``); means are averaged. Reading them from the
metrics row is how a run (and its e2e test) shows that a mechanism fired.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rollyard.core.events import EventKind, ToolResultEvent
from rollyard.core.trajectory import Trajectory

TERMS = ("outcome", "process", "speed")
COUNTS = ("tool_calls", "tool_errors", "context_rewrites", "test_access", "perturbations")


def event_counts(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """How often each recorded event kind occurred in a group (``count_`` keys)."""
    counts = dict.fromkeys(COUNTS, 0)
    for t in trajectories:
        for e in t.events:
            if e.kind == EventKind.TOOL_CALL:
                counts["tool_calls"] += 1
            elif e.kind == EventKind.TOOL_RESULT:
                result: ToolResultEvent = e.payload
                counts["tool_errors"] += result.is_error
            elif e.kind == EventKind.CONTEXT_REWRITE:
                counts["context_rewrites"] += 1
            elif e.kind == EventKind.TEST_ACCESS:
                counts["test_access"] += 1
            elif e.kind == EventKind.PERTURBATION:
                counts["perturbations"] += 1
    return {f"count_{k}": float(v) for k, v in counts.items()}


def step_stats(stats: Sequence[dict[str, float]]) -> dict[str, float]:
    """One row's worth: counts summed over the groups, everything else averaged."""
    keys = sorted({k for s in stats for k in s})
    return {
        k: (sum if k.startswith("count_") else statistics.fmean)([s.get(k, 0.0) for s in stats]) for k in keys
    }
