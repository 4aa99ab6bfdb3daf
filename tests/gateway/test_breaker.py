"""The engine circuit breaker and the per-program error budget (pure, fake clock)."""

from __future__ import annotations

from rollyard.core.clock import FakeClock
from rollyard.gateway.breaker import CircuitBreaker, ErrorBudget


def test_breaker_backoff_doubles_up_to_the_cap_and_resets_on_success() -> None:
    clock = FakeClock()
    b = CircuitBreaker(clock, base_s=1.0, max_s=5.0, threshold=1)
    assert b.state == "closed" and b.wait_s() == 0
    backoffs = []
    for _ in range(5):  # each failure is a failed probe, once the previous backoff ended
        backoffs.append(b.failure())
        assert b.state == "open"
        clock.advance(backoffs[-1])
    assert backoffs == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert b.state == "half_open" and b.wait_s() == 0  # one probe may pass
    b.success()
    assert b.state == "closed" and b.failures == 0
    assert b.failure() == 1.0  # a fresh failure starts from the base again


def test_error_budget_throttles_only_the_failing_program_then_lets_it_back() -> None:
    clock = FakeClock()
    budget = ErrorBudget(clock, max_errors=3, window_s=10.0, cooldown_s=30.0)
    for _ in range(3):
        assert budget.wait_s("bad") == 0
        budget.charge("bad")
        clock.advance(1.0)
    assert budget.wait_s("bad") > 0 and budget.throttled == 1
    assert budget.wait_s("good") == 0
    clock.advance(30.0)
    assert budget.wait_s("bad") == 0


def test_error_budget_ignores_failures_spread_over_more_than_the_window() -> None:
    clock = FakeClock()
    budget = ErrorBudget(clock, max_errors=3, window_s=10.0, cooldown_s=30.0)
    for _ in range(10):
        budget.charge("slow")
        clock.advance(6.0)
    assert budget.wait_s("slow") == 0 and budget.throttled == 0


def test_error_budget_memory_is_bounded_and_freed() -> None:
    clock = FakeClock()
    budget = ErrorBudget(clock, max_errors=5, window_s=1.0, max_programs=100)
    for i in range(1000):
        budget.charge(f"p{i}")
        clock.advance(0.1)
    assert len(budget) <= 100
    budget.forget("p999")
    assert "p999" not in budget._errors


def test_error_budget_zero_is_off() -> None:
    budget = ErrorBudget(FakeClock(), max_errors=0)
    for _ in range(100):
        budget.charge("p")
    assert budget.wait_s("p") == 0 and len(budget) == 0


def test_failures_of_one_incident_do_not_lengthen_the_backoff() -> None:
    """Hundreds of requests in flight when a connection breaks are one failure, not hundreds."""
    clock = FakeClock()
    b = CircuitBreaker(clock, base_s=1.0, max_s=30.0, threshold=1)
    assert b.failure() == 1.0
    for _ in range(200):
        b.failure()
    assert b.opens == 1 and b.wait_s() == 1.0
    clock.advance(1.0)
    assert b.failure() == 2.0 and b.opens == 2  # the probe after the backoff failed: doubled


def test_one_failure_between_successes_never_opens_the_breaker() -> None:
    """A dropped connection while other requests succeed is not an outage."""
    clock = FakeClock()
    b = CircuitBreaker(clock, threshold=3)
    for _ in range(50):
        assert b.failure() == 0.0 and b.state == "closed" and b.wait_s() == 0
        b.success()
        assert b.failure() == 0.0
        b.success()
    assert b.opens == 0


def test_consecutive_failures_open_at_the_threshold() -> None:
    clock = FakeClock()
    b = CircuitBreaker(clock, base_s=1.0, threshold=3)
    assert [b.failure(), b.failure()] == [0.0, 0.0] and b.state == "closed"
    assert b.failure() == 1.0 and b.state == "open" and b.opens == 1
    clock.advance(1.0)
    assert b.state == "half_open"
    assert b.failure() == 2.0  # the probe after the backoff failed: reopened at once, doubled


def test_a_failed_health_probe_trips_the_breaker_at_once() -> None:
    clock = FakeClock()
    b = CircuitBreaker(clock, base_s=1.0, threshold=3)
    assert b.failure() == 0.0
    assert b.trip() == 1.0 and b.state == "open" and b.opens == 1
    assert b.trip() == 1.0 and b.opens == 1  # the same incident
    clock.advance(1.0)
    b.success()
    assert b.state == "closed" and b.failure() == 0.0
