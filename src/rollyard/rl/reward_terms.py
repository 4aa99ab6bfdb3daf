"""Built-in reward terms: outcome (pass fraction, binary, judge), process penalties and speed.

Registered on import of ``rollyard.rl.rewards``; each documents its parameters.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from typing import Any

from rollyard.core.errors import ConfigError, DataError
from rollyard.core.events import EventKind, ToolCallEvent, ToolResultEvent
from rollyard.core.json_text import UNREADABLE, read_json
from rollyard.core.trajectory import Outcome, Trajectory
from rollyard.rl.language import is_language_mixed
from rollyard.rl.reward_base import RewardContext, TermKind, register_reward, turn_text


def _outcome(t: Trajectory) -> Outcome:
    if t.outcome is None:
        raise DataError(f"trajectory {t.id} has no outcome to score")
    return t.outcome


def succeeded(t: Trajectory) -> bool:
    """Passed when ``passed`` says so, else when every hidden test passed; no result = failed."""
    o = _outcome(t)
    if o.passed is not None:
        return o.passed
    return o.pass_fraction is not None and o.pass_fraction >= 1.0


def _params(params: dict[str, Any], allowed: dict[str, Any]) -> dict[str, Any]:
    unknown = set(params) - set(allowed)
    if unknown:
        raise ConfigError(f"unknown reward parameters {sorted(unknown)}; allowed: {sorted(allowed)}")
    return {**allowed, **params}


@register_reward("pass_fraction", TermKind.OUTCOME)
def pass_fraction(trajs: Sequence[Trajectory], params: dict[str, Any], ctx: RewardContext) -> list[float]:
    """Fraction of hidden tests passed; ``passed`` alone counts as 1 or 0; no result is 0."""
    _params(params, {})
    out = []
    for t in trajs:
        o = _outcome(t)
        if o.pass_fraction is not None:
            out.append(o.pass_fraction)
        else:
            out.append(1.0 if o.passed else 0.0)
    return out


@register_reward("binary", TermKind.OUTCOME)
def binary(trajs: Sequence[Trajectory], params: dict[str, Any], ctx: RewardContext) -> list[float]:
    """``success`` (default 1) when the trajectory passed, else ``failure`` (default 0)."""
    p = _params(params, {"success": 1.0, "failure": 0.0})
    return [float(p["success"]) if succeeded(t) else float(p["failure"]) for t in trajs]


@register_reward("judge", TermKind.OUTCOME)
def judge(trajs: Sequence[Trajectory], params: dict[str, Any], ctx: RewardContext) -> list[float]:
    """An LLM judge's score of the transcript, in [0, 1]. The run asks the judge
    (``rewards.judge``) before scoring and passes the scores in the context."""
    _params(params, {})
    missing = [t.id for t in trajs if t.id not in ctx.judged]
    if missing:
        raise ConfigError(
            f"the 'judge' reward has no judge score for {len(missing)} trajectories; set rewards.judge"
        )
    return [float(ctx.judged[t.id]) for t in trajs]


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        text, arguments = arguments, read_json(arguments)
        if arguments is UNREADABLE:
            return text.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def turn_penalties(t: Trajectory, p: dict[str, Any], ctx: RewardContext) -> list[dict[str, bool]]:
    """Which penalties each turn earned: malformed call, tool error, repeated call, mixing."""
    seen: set[tuple[str, str]] = set()
    repeated: set[int] = set()
    errors: set[int] = set()
    malformed: set[int] = set()
    for e in t.events:
        if e.turn_index is None:
            continue
        if e.kind == EventKind.TOOL_CALL:
            call: ToolCallEvent = e.payload
            key = (call.name, _canonical(call.arguments))
            if key in seen:
                repeated.add(e.turn_index)
            seen.add(key)
        elif e.kind == EventKind.TOOL_RESULT:
            result: ToolResultEvent = e.payload
            if result.malformed:  # unknown tool or bad arguments: the malformed-call penalty
                malformed.add(e.turn_index)
            elif result.is_error:
                errors.add(e.turn_index)
    out = []
    for turn in t.turns:
        text = turn_text(t, turn) if p["language_mixing"] else None
        mixed = text is not None and is_language_mixed(
            text, expected=p["expected_scripts"], min_share=p["min_share"]
        )
        out.append(
            {
                "malformed_tool_call": "malformed_tool_call" in turn.flags or turn.index in malformed,
                "tool_error": turn.index in errors,
                "repeated_command": turn.index in repeated,
                "language_mixing": mixed,
            }
        )
    return out


_PENALTY_DEFAULTS = {
    "malformed_tool_call": 1.0,
    "tool_error": 0.5,
    "repeated_command": 0.5,
    "language_mixing": 0.5,
    "per_turn_mean": True,
    "expected_scripts": None,
    "min_share": 0.1,
}


@register_reward("penalties", TermKind.PROCESS)
def penalties(trajs: Sequence[Trajectory], params: dict[str, Any], ctx: RewardContext) -> list[list[float]]:
    """Per turn, minus the sum of the weights of the penalties it earned (weights are params;
    0 turns a check off). With ``per_turn_mean`` (default) each turn's value is divided by the
    number of turns, so the trajectory's process score is the mean penalty per turn."""
    p = _params(params, _PENALTY_DEFAULTS)
    kinds = ["malformed_tool_call", "tool_error", "repeated_command", "language_mixing"]
    if any(float(p[k]) < 0 for k in kinds):
        raise ConfigError("penalty weights must be >= 0 (they are subtracted)")
    out = []
    for t in trajs:
        flags = turn_penalties(t, p, ctx)
        scale = 1.0 / max(1, len(flags)) if p["per_turn_mean"] else 1.0
        out.append([-scale * sum(float(p[k]) for k in kinds if f[k]) for f in flags])
    return out


def _h(name: str, x: float, clip: float) -> float:
    """Decreasing speed shapes with h(1) = 0: faster than the baseline is positive."""
    if name == "linear":
        v = 1.0 - x
    elif name == "log":
        v = -math.log(x) if x > 0 else clip
    elif name == "inverse":
        v = 1.0 / x - 1.0 if x > 0 else clip
    else:
        raise ConfigError(f"unknown speed shape h={name!r}; use linear, log or inverse")
    return max(-clip, min(clip, v))


def duration(t: Trajectory) -> float | None:
    """The agent's own wall time: its first model request submitted to its last response
    finished (gateway clock). Not the hidden tests' run time. None without turns."""
    if not t.turns:
        return None
    d = t.turns[-1].timings.finished - t.turns[0].timings.submitted
    if not math.isfinite(d) or d < 0:
        raise DataError(f"trajectory {t.id} has an invalid duration {d!r}")
    return d


@register_reward("completion_time", TermKind.SPEED)
def completion_time(trajs: Sequence[Trajectory], params: dict[str, Any], ctx: RewardContext) -> list[float]:
    """h(T / T_baseline), clipped to [-clip, clip], T the agent's wall time (``duration``).

    The baseline: the group's mean or median (over successful members when
    ``only_successful``), a fixed ``baseline_s``, or ``task``: the task's own ``baseline_s``
    (``metadata.baseline_s`` in its task.yaml). Failed trajectories get 0 when
    ``only_successful`` (speed must not reward quick failure), and so do trajectories without
    turns; with no usable baseline (none succeeded, or it is 0 s) every value is 0."""
    p = _params(
        params,
        {"baseline": "group_mean", "baseline_s": None, "h": "linear", "clip": 1.0, "only_successful": True},
    )
    durations = [duration(t) for t in trajs]
    ok = [
        d is not None and (succeeded(t) or not p["only_successful"])
        for t, d in zip(trajs, durations, strict=True)
    ]
    pool = [d for d, good in zip(durations, ok, strict=True) if good and d is not None]
    if p["baseline"] == "fixed":
        if p["baseline_s"] is None or not float(p["baseline_s"]) > 0:
            raise ConfigError("a fixed speed baseline needs baseline_s > 0")
        base = float(p["baseline_s"])
    elif p["baseline"] == "task":
        if ctx.baseline_s is None or not ctx.baseline_s > 0:
            raise ConfigError("speed baseline 'task' needs metadata.baseline_s > 0 in the task's task.yaml")
        base = ctx.baseline_s
    elif p["baseline"] in ("group_mean", "group_median"):
        if not pool:
            return [0.0] * len(trajs)
        base = statistics.fmean(pool) if p["baseline"] == "group_mean" else statistics.median(pool)
    else:
        raise ConfigError(
            f"unknown speed baseline {p['baseline']!r}; use group_mean, group_median, fixed or task"
        )
    if base <= 0:
        return [0.0] * len(trajs)
    clip = float(p["clip"])
    return [
        _h(p["h"], d / base, clip) if good and d is not None else 0.0
        for d, good in zip(durations, ok, strict=True)
    ]
