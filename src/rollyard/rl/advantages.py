"""Advantages for a group of trajectories, and the ``Sample``s the trainer consumes.

Three estimators, all critic-free and relative to the group:

* GRPO: A_i = (r_i - b_i) / s, b_i the group mean (or the mean of the others,
  leave-one-out), s the group's population std when ``normalize_std``.
* reward-to-go: per-turn returns G_{i,t} = sum_k gamma^(k-t) r_{i,k}, minus the same baseline
  computed from the trajectories' full returns G_{i,0}.
* chunked MDP (ROLL's IPA): a chunk runs from one environment interaction to the next; its
  return is the discounted sum of the per-chunk rewards from it on, centred by the GRPO
  baseline discounted to it (with a final reward only: gamma^(K-1-k) times the GRPO advantage).

Scale (``normalize_std``): GRPO divides by the population std s of the rewards. Per-turn and
per-chunk values are centred returns c, which can differ from one another far more than the
total rewards do (two rewards 2.4e-4 apart, with per-chunk rewards of 0.1, would give c / s in
the hundreds), so they are divided by max(s, max|c| / B) with B = n / sqrt(n - 1), n the group
size. Bound, for any rewards and n >= 2: every advantage satisfies |A| <= B at every level
(GRPO's own z-scores obey it: |x - mean| <= sqrt(n - 1) s, and leave-one-out centring multiplies
by n / (n - 1)); with a final reward only (c = gamma^k (R - b)) the divisor is s, so the
documented equalities with GRPO hold. ``normalize_std: false`` (Dr. GRPO) leaves advantages in
reward units.

Documented rules for degenerate groups: a group of one has no baseline to compare with and
gets advantage 0; when the divisor is below ``eps`` (all returns equal) advantages are the
centred values, all below B * eps (so within B for eps <= 1), and are not divided.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import DataError
from rollyard.core.sample import Sample
from rollyard.core.trajectory import EventKind, Trajectory
from rollyard.rl.rewards import reward_to_go

_INTERACTIONS = (EventKind.TOOL_CALL, EventKind.TOOL_RESULT)


class AdvantageMode(StrEnum):
    GRPO = "grpo"
    REWARD_TO_GO = "reward_to_go"
    CHUNK = "chunk"


class AdvantageConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: AdvantageMode = AdvantageMode.GRPO
    normalize_std: bool = True
    leave_one_out: bool = False
    gamma: float = Field(default=1.0, ge=0.0, le=1.0)
    eps: float = Field(default=1e-6, gt=0.0)


def _check(values: Sequence[float], what: str) -> list[float]:
    if len(values) == 0:
        raise DataError(f"empty group: no {what}")
    out = [float(v) for v in values]
    if any(not math.isfinite(v) for v in out):
        raise DataError(f"{what} contain NaN or infinite values")
    return out


def grpo_advantages(
    rewards: Sequence[float],
    *,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> list[float]:
    """Group-relative advantages (see module doc for the degenerate-group rules)."""
    r = _check(rewards, "rewards")
    n = len(r)
    if n == 1:
        return [0.0]
    mean = statistics.fmean(r)
    centred = [x - (sum(r) - x) / (n - 1) if leave_one_out else x - mean for x in r]
    if not normalize_std:
        return centred
    std = statistics.pstdev(r)
    return centred if std < eps else [c / std for c in centred]


def advantage_bound(n: int) -> float:
    """B = n / sqrt(n - 1): no advantage of a group of n >= 2 exceeds it in magnitude (module doc)."""
    return n / math.sqrt(n - 1) if n > 1 else 0.0


def _divisor(
    std: float, centred: Sequence[Sequence[float]], n: int, normalize_std: bool, eps: float
) -> float:
    """max(std, max|c| / B), or 1 when not normalising or below ``eps`` (module doc)."""
    if not normalize_std:
        return 1.0
    peak = max((abs(c) for row in centred for c in row), default=0.0)
    scale = max(std, peak / advantage_bound(n))
    return scale if scale >= eps else 1.0


def turn_advantages(
    turn_rewards: Sequence[Sequence[float]],
    *,
    gamma: float = 1.0,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> list[list[float]]:
    """Per-turn reward-to-go advantages: A_{i,t} = (G_{i,t} - b_i) / s, with b taken from
    the full returns G_{i,0} and s the bounded divisor of the module doc (|A| <= n / sqrt(n - 1)).
    With gamma = 1 and only a final reward this is GRPO per turn."""
    if len(turn_rewards) == 0:
        raise DataError("empty group: no turn rewards")
    returns = [reward_to_go(r, gamma) for r in turn_rewards]
    totals = _check([g[0] if g else 0.0 for g in returns], "returns")
    n = len(totals)
    if n == 1:
        return [[0.0] * len(g) for g in returns]
    mean = statistics.fmean(totals)
    centred = []
    for i, g in enumerate(returns):
        base = (sum(totals) - totals[i]) / (n - 1) if leave_one_out else mean
        centred.append([x - base for x in g])
    scale = _divisor(statistics.pstdev(totals), centred, n, normalize_std, eps)
    return [[c / scale for c in row] for row in centred]


def turn_chunks(trajectory: Trajectory) -> list[int]:
    """Chunk index of each turn: a new chunk starts after a turn followed by a tool call or
    tool result event. A trajectory without such events is one chunk."""
    after_interaction = {e.turn_index for e in trajectory.events if e.kind in _INTERACTIONS}
    out, k = [], 0
    for turn in trajectory.turns:
        out.append(k)
        if turn.index in after_interaction:
            k += 1
    return out


def chunk_advantages(
    trajectories: Sequence[Trajectory],
    rewards: Sequence[float],
    *,
    turn_rewards: Sequence[Sequence[float]] | None = None,
    gamma: float = 1.0,
    normalize_std: bool = True,
    leave_one_out: bool = False,
    eps: float = 1e-6,
) -> tuple[list[list[float]], list[list[int]]]:
    """Per-turn advantages and chunk ids under the chunked MDP.

    Chunk k's return is the discounted sum of the per-chunk rewards from k on (a chunk's reward
    is the sum of its turns' ``turn_rewards``; without them, the whole reward sits on the last
    chunk, so G_k = gamma^(chunks to end) * R). The advantage is (G_k - gamma^(chunks to end) *
    b) / s, with the baseline b of GRPO over the trajectories' total ``rewards`` and s the bounded
    divisor of the module doc: with a final reward only this is gamma^(chunks to end) times the
    GRPO advantage."""
    n = len(trajectories)
    if len(rewards) != n or (turn_rewards is not None and len(turn_rewards) != n):
        raise DataError(f"{n} trajectories but {len(rewards)} rewards")
    if not 0.0 <= gamma <= 1.0:
        raise DataError(f"discount gamma must be in [0, 1], got {gamma}")
    r = _check(rewards, "rewards")
    mean = statistics.fmean(r)
    centred, chunks = [], []
    for i, t in enumerate(trajectories):
        ids = turn_chunks(t)
        k_count = (ids[-1] + 1) if ids else 1
        per_chunk = [0.0] * k_count
        if turn_rewards is not None:
            if len(turn_rewards[i]) != len(ids):
                raise DataError(f"trajectory {t.id}: need one reward per turn, {len(ids)}")
            for k, x in zip(ids, turn_rewards[i], strict=True):
                per_chunk[k] += x
        else:
            per_chunk[-1] = r[i]
        returns = reward_to_go(per_chunk, gamma)
        base = (sum(r) - r[i]) / (n - 1) if leave_one_out and n > 1 else mean
        if n == 1:
            centred.append([0.0] * len(ids))
        else:
            centred.append([returns[k] - gamma ** (k_count - 1 - k) * base for k in ids])
        chunks.append(ids)
    scale = _divisor(statistics.pstdev(r), centred, n, normalize_std, eps)
    return [[c / scale for c in row] for row in centred], chunks


def build_samples(
    trajectories: Sequence[Trajectory],
    advantages: Sequence[Sequence[float]],
    rewards: Sequence[float],
    chunk_ids: Sequence[Sequence[int]] | None = None,
) -> list[Sample]:
    """One ``Sample`` per segment; each completion token carries its turn's advantage (and
    chunk id). ``advantages[i][j]`` belongs to the j-th turn of ``trajectories[i].turns``."""
    n = len(trajectories)
    if len(advantages) != n or len(rewards) != n or (chunk_ids is not None and len(chunk_ids) != n):
        raise DataError("trajectories, advantages, rewards and chunk_ids must have one entry each")
    samples = []
    for i, t in enumerate(trajectories):
        if len(advantages[i]) != t.num_turns or (chunk_ids is not None and len(chunk_ids[i]) != t.num_turns):
            raise DataError(f"trajectory {t.id}: need one advantage (and chunk id) per turn, {t.num_turns}")
        j = 0
        for s, segment in enumerate(t.segments):
            if not segment.turns:
                continue
            length = len(segment.turns[-1].prompt_ids) + len(segment.turns[-1].completion_ids)
            adv = [0.0] * length
            chunks = [-1] * length if chunk_ids is not None else None
            for turn in segment.turns:
                start = len(turn.prompt_ids)
                for pos in range(start, start + len(turn.completion_ids)):
                    adv[pos] = float(advantages[i][j])
                    if chunks is not None and chunk_ids is not None:
                        chunks[pos] = int(chunk_ids[i][j])
                j += 1
            samples.append(
                Sample.from_segment(
                    segment,
                    adv,
                    group_id=t.group_id,
                    trajectory_id=t.id,
                    reward=float(rewards[i]),
                    chunk_ids=chunks,
                    meta={"segment": s},
                )
            )
    return samples


def _rewards_of(trajectories: Sequence[Trajectory]) -> list[float]:
    out = []
    for t in trajectories:
        if t.outcome is None or t.outcome.reward is None:
            raise DataError(f"trajectory {t.id} has no reward; score the group first")
        out.append(t.outcome.reward)
    return out


def group_samples(
    trajectories: Sequence[Trajectory],
    config: AdvantageConfig,
    rewards: Sequence[float] | None = None,
    turn_rewards: Sequence[Sequence[float]] | None = None,
) -> list[Sample]:
    """Advantages for one group by ``config.mode``, as trainer samples.

    ``rewards`` default to each trajectory's ``outcome.reward``; the reward-to-go mode needs
    ``turn_rewards`` (e.g. ``RewardBreakdown.per_turn``).
    """
    if not trajectories:
        raise DataError("empty group")
    r = list(rewards) if rewards is not None else _rewards_of(trajectories)
    if len(r) != len(trajectories):
        raise DataError(f"{len(trajectories)} trajectories but {len(r)} rewards")
    kw = {"normalize_std": config.normalize_std, "leave_one_out": config.leave_one_out, "eps": config.eps}
    if config.mode == AdvantageMode.GRPO:
        a = grpo_advantages(r, **kw)
        per_turn = [[x] * t.num_turns for x, t in zip(a, trajectories, strict=True)]
        return build_samples(trajectories, per_turn, r)
    if config.mode == AdvantageMode.REWARD_TO_GO:
        if turn_rewards is None:
            raise DataError("reward_to_go advantages need per-turn rewards")
        return build_samples(trajectories, turn_advantages(turn_rewards, gamma=config.gamma, **kw), r)
    advs, chunks = chunk_advantages(trajectories, r, turn_rewards=turn_rewards, gamma=config.gamma, **kw)
    return build_samples(trajectories, advs, r, chunks)
