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
from rollyard.core.trajectory import EventKind, Outcome, Trajectory
from rollyard.rl.language import is_language_mixed
from rollyard.rl.rewards import RewardContext, TermKind, register_reward


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
    """An LLM judge's score of the decoded transcript (the context must carry a judge)."""
    _params(params, {})
    if ctx.judge is None:
        raise ConfigError("the 'judge' reward needs a judge in the RewardContext")
    return [ctx.judge.score(ctx.transcript(t)) for t in trajs]


def _canonical(arguments: Any) -> str:
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments.strip()
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str)


def turn_penalties(t: Trajectory, p: dict[str, Any], ctx: RewardContext) -> list[dict[str, bool]]:
    """Which penalties each turn earned: malformed call, tool error, repeated call, mixing."""
    seen: set[tuple[str, str]] = set()
    repeated: set[int] = set()
    errors: set[int] = set()
    for e in t.events:
        if e.turn_index is None:
            continue
        if e.kind == EventKind.TOOL_CALL:
            key = (str(e.data.get("name", "")), _canonical(e.data.get("arguments", "")))
            if key in seen:
                repeated.add(e.turn_index)
            seen.add(key)
        elif e.kind == EventKind.TOOL_RESULT and e.data.get("is_error"):
            errors.add(e.turn_index)
    out = []
    for turn in t.turns:
        text = ctx.text_of(t, turn) if p["language_mixing"] else None
        mixed = text is not None and is_language_mixed(
            text, expected=p["expected_scripts"], min_share=p["min_share"]
        )
        out.append(
            {
                "malformed_tool_call": "malformed_tool_call" in turn.flags,
                "tool_error": "tool_error" in turn.flags or turn.index in errors,
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


def duration(t: Trajectory) -> float:
    """``outcome.duration_s``, else the span of the turn timings."""
    o = _outcome(t)
    if o.duration_s is not None:
        d = o.duration_s
    elif t.turns:
        d = t.turns[-1].timings.finished - t.turns[0].timings.submitted
    else:
        raise DataError(f"trajectory {t.id} has no duration and no turns")
    if not math.isfinite(d) or d < 0:
        raise DataError(f"trajectory {t.id} has an invalid duration {d!r}")
    return d


@register_reward("completion_time", TermKind.SPEED)
def completion_time(trajs: Sequence[Trajectory], params: dict[str, Any], ctx: RewardContext) -> list[float]:
    """h(T / T_baseline), clipped to [-clip, clip]. The baseline is the group's mean or median
    duration (over successful members when ``only_successful``) or a fixed ``baseline_s``.
    Failed trajectories get 0 when ``only_successful`` (speed must not reward quick failure);
    with no usable baseline (none succeeded, or it is 0 s) every value is 0."""
    p = _params(
        params,
        {"baseline": "group_mean", "baseline_s": None, "h": "linear", "clip": 1.0, "only_successful": True},
    )
    durations = [duration(t) for t in trajs]
    ok = [succeeded(t) or not p["only_successful"] for t in trajs]
    pool = [d for d, good in zip(durations, ok, strict=True) if good]
    if p["baseline"] == "fixed":
        if p["baseline_s"] is None or not float(p["baseline_s"]) > 0:
            raise ConfigError("a fixed speed baseline needs baseline_s > 0")
        base = float(p["baseline_s"])
    elif p["baseline"] in ("group_mean", "group_median"):
        if not pool:
            return [0.0] * len(trajs)
        base = statistics.fmean(pool) if p["baseline"] == "group_mean" else statistics.median(pool)
    else:
        raise ConfigError(f"unknown speed baseline {p['baseline']!r}; use group_mean, group_median or fixed")
    if base <= 0:
        return [0.0] * len(trajs)
    clip = float(p["clip"])
    return [_h(p["h"], d / base, clip) if good else 0.0 for d, good in zip(durations, ok, strict=True)]
