"""The group ledger: every group number ends once; in-flight groups come back after a restart."""

from __future__ import annotations

import pytest

from rollyard.core.errors import Conflict, DataError
from rollyard.rollout.ledger import GroupLedger, group_id, task_for


def test_claims_are_the_smallest_free_numbers() -> None:
    led = GroupLedger()
    assert [led.claim() for _ in range(3)] == [0, 1, 2]
    led.mark_trained(1, step=1)
    assert led.in_flight() == 2
    assert led.claim() == 3


def test_groups_in_flight_at_a_checkpoint_are_issued_again_after_restore() -> None:
    led = GroupLedger()
    for _ in range(4):
        led.claim()
    led.mark_trained(0, 1)
    led.mark_dropped(2, "stale")
    back = GroupLedger.from_state(led.state_dict())
    assert [back.claim(), back.claim(), back.claim()] == [1, 3, 4]


def test_a_group_cannot_end_twice() -> None:
    led = GroupLedger()
    n = led.claim()
    led.mark_trained(n, 1)
    with pytest.raises(Conflict):
        led.mark_dropped(n, "stale")


def test_a_ledger_that_trained_and_dropped_one_group_is_malformed() -> None:
    with pytest.raises(DataError):
        GroupLedger.from_state({"trained": {"1": 1}, "dropped": {"1": "stale"}})


def test_task_choice_is_deterministic_and_covers_each_task_once_per_pass() -> None:
    tasks = list("abcde")
    first = [task_for(n, tasks, seed=3) for n in range(5)]
    assert sorted(first) == tasks
    assert first == [task_for(n, tasks, seed=3) for n in range(5)]
    assert group_id(12) == "g000012"
