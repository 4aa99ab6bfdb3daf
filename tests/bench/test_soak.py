"""``rollyard bench soak``'s reading of the gateway's loop-lag histogram."""

from __future__ import annotations

import math

import pytest

from rollyard.bench._soak_watch import bucket_quantile


def test_a_quantile_comes_from_the_observations_between_two_scrapes_linear_within_its_bucket() -> None:
    before = {0.001: 10.0, 0.01: 10.0, 0.1: 10.0, math.inf: 10.0}
    # Since the first scrape: 50 under 1 ms, 40 in (1, 10] ms, 10 in (10, 100] ms.
    after = {0.001: 60.0, 0.01: 100.0, 0.1: 110.0, math.inf: 110.0}
    assert bucket_quantile(before, after, 0.5) == pytest.approx(0.001)
    assert bucket_quantile(before, after, 0.7) == pytest.approx(0.001 + 0.009 * 20 / 40)
    assert bucket_quantile(before, after, 0.99) == pytest.approx(0.01 + 0.09 * 9 / 10)


def test_a_quantile_in_the_open_bucket_is_the_highest_bound_and_nothing_observed_is_zero() -> None:
    assert bucket_quantile({}, {0.1: 1.0, math.inf: 10.0}, 0.99) == 0.1
    assert bucket_quantile({0.1: 3.0, math.inf: 3.0}, {0.1: 3.0, math.inf: 3.0}, 0.99) == 0.0
