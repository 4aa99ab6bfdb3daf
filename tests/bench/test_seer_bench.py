"""The seer benchmark's workload and tail measure (the benchmark itself runs real engines)."""

from __future__ import annotations

import asyncio

import pytest

from rollyard.bench.seer import _DRAW, Draw, StopAtLength, tail_share, timeline, workload
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Completion


def test_the_workload_is_long_tailed_within_and_across_groups() -> None:
    groups = workload(16, 8, seed=0, min_len=16, max_len=1024)
    assert len(groups) == 16 and all(len(g) == 8 for g in groups)
    assert all(min(g) >= 16 and max(g) <= 1024 for g in groups)
    assert max(max(g) / min(g) for g in groups) >= 5  # siblings spread up to ~10x
    tops = sorted(max(g) for g in groups)
    assert tops[-1] >= 2 * tops[len(tops) // 2]  # a few groups much longer than the median
    assert min(min(g) for g in groups) < 100 and tops[-1] >= 1000  # tens to ~1k tokens
    assert workload(16, 8, seed=0, min_len=16, max_len=1024) == groups  # the same in every variant


def test_no_submission_order_is_length_sorted() -> None:
    """FIFO in the baseline must not start each group's longest first by accident."""
    groups = workload(16, 8, seed=0, min_len=16, max_len=1024)
    assert len({g.index(max(g)) for g in groups}) >= 4
    assert sum(g == sorted(g, reverse=True) for g in groups) == 0


def test_tail_share_is_the_time_after_ninety_percent_finished() -> None:
    finishes = [1.0] * 9 + [10.0]
    assert tail_share(finishes, 10.0) == pytest.approx(0.9)
    assert tail_share([5.0] * 10, 10.0) == pytest.approx(0.5)


class _Echo:
    """A fake engine that generates exactly what it is asked for."""

    name, max_model_len, policy_version = "e", 2048, 0

    def __init__(self) -> None:
        self.asked: list[int] = []

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        self.asked.append(params.max_tokens)
        n = params.max_tokens
        return Completion(
            token_ids=[1] * n, logprobs=[0.0] * n, finish_reason=FinishReason.LENGTH, prompt_tokens=1
        )


def test_generations_end_at_the_drawn_length_which_only_the_engine_side_reads() -> None:
    inner = _Echo()
    engine = StopAtLength(inner, [0.0])  # type: ignore[arg-type]
    draw = Draw(300)

    async def chunks() -> list[FinishReason]:
        _DRAW.set(draw)
        out = []
        for _ in range(2):  # the gateway asks for 256-token chunks of a 1536-token cap
            out.append((await engine.generate([0], SamplingParams(max_tokens=256))).finish_reason)
        return out

    reasons = asyncio.run(chunks())
    assert inner.asked == [256, 44] and reasons == [FinishReason.LENGTH, FinishReason.STOP]
    assert draw.left == 0 and [c[3] for c in draw.calls] == [256, 44]
    # outside a bench client's task there is no draw: the call passes through untouched
    done = asyncio.run(engine.generate([0], SamplingParams(max_tokens=7)))
    assert inner.asked[-1] == 7 and done.finish_reason is FinishReason.LENGTH


def test_the_timeline_counts_idle_seconds_and_mean_running_per_engine() -> None:
    a, b = Draw(1), Draw(1)
    a.calls = [("e0", 0.0, 4.0, 1)]
    b.calls = [("e0", 0.0, 2.0, 1), ("e1", 2.0, 3.0, 1)]
    lines = timeline([a, b], ["e0", "e1"], wall=4.0)
    assert lines["e0"]["idle_s"] == pytest.approx(0.0) and lines["e1"]["idle_s"] == pytest.approx(3.0)
    assert lines["e0"]["mean_running"] == pytest.approx(1.5) and lines["e1"]["mean_running"] == pytest.approx(
        0.25
    )
    assert lines["e0"]["running_1s"] == [2, 2, 1, 1] and lines["e1"]["running_1s"] == [0, 0, 1, 0]
    assert lines["e0"]["tok_s_1s"] == [1, 1, 0, 0] and lines["e1"]["tok_s_1s"] == [0, 0, 1, 0]
