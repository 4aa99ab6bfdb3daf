"""The seer benchmark's workload and tail measure (the benchmark itself runs real engines)."""

from __future__ import annotations

import pytest

from rollyard.bench.seer import tail_share, workload


def test_the_workload_is_long_tailed_within_and_across_groups() -> None:
    groups = workload(16, 8, seed=0, min_len=32, max_len=768)
    assert len(groups) == 16 and all(len(g) == 8 for g in groups)
    assert all(g[0] == max(g) and 32 <= g[0] <= 768 for g in groups)
    assert max(max(g) / min(g) for g in groups) >= 5  # siblings spread up to ~10x
    tops = sorted(g[0] for g in groups)
    assert tops[-1] >= 3 * tops[len(tops) // 2]  # a few groups much longer than the median
    assert workload(16, 8, seed=0, min_len=32, max_len=768) == groups  # the same in every variant


def test_tail_share_is_the_time_after_ninety_percent_finished() -> None:
    finishes = [1.0] * 9 + [10.0]
    assert tail_share(finishes, 10.0) == pytest.approx(0.9)
    assert tail_share([5.0] * 10, 10.0) == pytest.approx(0.5)
