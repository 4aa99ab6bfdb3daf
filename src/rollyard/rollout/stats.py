"""Per-group figures the step's metrics row is built from: reward terms and event counts.

Counts add up across a step's groups (``sum_stats``); means are averaged. Reading them from the
metrics row is how a run (and its e2e test) shows that a mechanism fired.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from rollyard.core.events import EventKind, ToolCallEvent, ToolResultEvent
from rollyard.core.trajectory import Trajectory

TERMS = ("outcome", "process", "speed")
COUNTS = ("tool_calls", "tool_errors", "context_rewrites", "test_access", "perturbations")


def event_counts(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """How often each recorded event kind occurred in a group (``count_`` keys), and how many
    completion tokens a tool-call grammar forced (``count_forced_tokens``: left out of training)."""
    counts = dict.fromkeys(COUNTS, 0)
    counts["forced_tokens"] = sum(b - a for t in trajectories for turn in t.turns for a, b in turn.forced)
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


def first_call(t: Trajectory) -> str:
    """The name of the episode's first tool call (``none`` when it made none)."""
    for e in t.events:
        if e.kind == EventKind.TOOL_CALL:
            call: ToolCallEvent = e.payload
            return call.name
    return "none"


def first_call_stats(
    trajectories: Sequence[Trajectory], passed: Sequence[float], prefix: str
) -> dict[str, float]:
    """What the agent did first and how that went: ``first_<tool>`` (share of episodes whose first
    call was ``<tool>``) and ``success_first_<tool>``. A policy's change of habit shows here, e.g.
    reading before answering instead of guessing."""
    by_first: dict[str, list[float]] = {}
    for t, ok in zip(trajectories, passed, strict=True):
        by_first.setdefault(first_call(t), []).append(ok)
    out: dict[str, float] = {}
    for name, oks in sorted(by_first.items()):
        out[f"{prefix}first_{name}"] = len(oks) / len(trajectories)
        out[f"{prefix}success_first_{name}"] = statistics.fmean(oks)
    return out


def step_stats(stats: Sequence[dict[str, float]]) -> dict[str, float]:
    """One row's worth: counts summed over the groups, everything else averaged."""
    keys = sorted({k for s in stats for k in s})
    return {
        k: (sum if k.startswith("count_") else statistics.fmean)([s.get(k, 0.0) for s in stats]) for k in keys
    }
