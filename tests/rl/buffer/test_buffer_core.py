"""Hand-worked cases for the buffer core's release rules."""

from __future__ import annotations

import json

import pytest

from rollyard.core import Conflict, DataError, FakeClock, NotFound
from rollyard.rl.buffer import BufferConfig, ReleaseRule, StaleAction, WindowedFifo


def _fill(buf: WindowedFifo, n: int, version: int = 0) -> None:
    for i in range(n):
        buf.submit(f"t{i}", policy_version=version, payload={"i": i})


def _ids(release) -> list[str]:
    return [r.item_id for r in release.items]


def test_window_allows_any_completed_item_inside_it_but_none_outside() -> None:
    buf = WindowedFifo(BufferConfig(window=3))
    _fill(buf, 6)
    for i in (2, 3, 4):
        buf.complete(f"t{i}")
    # head t0 pending: window is t0..t2, only t2 is done; t3, t4 are outside
    assert _ids(buf.release(0, 10)) == ["t2"]
    assert _ids(buf.release(0, 10)) == []


def test_window_advances_only_when_the_head_is_taken() -> None:
    buf = WindowedFifo(BufferConfig(window=2))
    _fill(buf, 5)
    buf.complete("t1")
    assert _ids(buf.release(0, 5)) == ["t1"]
    assert buf.window_bounds() == (0, 1)  # t1 gone, head t0 still there
    buf.complete("t2")
    assert _ids(buf.release(0, 5)) == []
    buf.complete("t0")
    # taking t0 moves the window to [2, 3], where t2 is done
    assert _ids(buf.release(0, 5)) == ["t0", "t2"]
    assert buf.window_bounds() == (3, 4)


def test_window_releases_in_completion_order() -> None:
    buf = WindowedFifo(BufferConfig(window=4))
    _fill(buf, 4)
    for i in (3, 1, 2, 0):
        buf.complete(f"t{i}")
    assert _ids(buf.release(0, 4)) == ["t3", "t1", "t2", "t0"]


def test_window_fraction_is_a_share_of_live_units() -> None:
    cfg = BufferConfig(window_fraction=0.3)
    assert cfg.window_size(10) == 3
    assert cfg.window_size(11) == 4
    assert cfg.window_size(1) == 1
    buf = WindowedFifo(cfg)
    _fill(buf, 10)
    buf.complete("t2")
    buf.complete("t3")
    assert _ids(buf.release(0, 10)) == ["t2"]  # W = 3 of 10 live


def test_window_fraction_is_fixed_while_its_head_stays() -> None:
    buf = WindowedFifo(BufferConfig(window_fraction=0.5))
    _fill(buf, 4)
    assert buf.release(0, 1).items == []  # the first look at head 0 fixes W = ceil(0.5 * 4) = 2
    assert buf.window_bounds() == (0, 1)
    for i in range(4, 10):
        buf.submit(f"t{i}")
    buf.complete("t1")
    buf.complete("t2")
    assert buf.window_bounds() == (0, 1)  # six more live units did not widen it
    assert _ids(buf.release(0, 10)) == ["t1"]
    assert buf.window_bounds() == (0, 1)  # a release behind the head does not narrow it
    buf.complete("t0")
    assert _ids(buf.release(0, 1)) == ["t0"]
    assert buf.window_bounds() == (2, 2 + 4 - 1)  # new head 2, 8 live: W would be 4
    buf.complete("t5")
    assert _ids(buf.release(0, 5)) == ["t2", "t5"]  # head 2: W = 4; then head 3: W = 4 of 7


def test_strict_fifo_releases_only_the_head() -> None:
    buf = WindowedFifo(BufferConfig(rule=ReleaseRule.FIFO))
    _fill(buf, 3)
    buf.complete("t1")
    buf.complete("t2")
    assert _ids(buf.release(0, 3)) == []
    buf.complete("t0")
    assert _ids(buf.release(0, 3)) == ["t0", "t1", "t2"]


def test_freshest_first_prefers_the_newest_policy_version() -> None:
    buf = WindowedFifo(BufferConfig(rule=ReleaseRule.FRESHEST))
    for i, v in enumerate([0, 2, 1, 2]):
        buf.submit(f"t{i}", policy_version=v)
    for i in range(4):
        buf.complete(f"t{i}")
    # version 2 first (most recently finished first), then 1, then 0
    assert _ids(buf.release(2, 4)) == ["t3", "t1", "t2", "t0"]


def test_stale_units_are_dropped_beyond_the_bound() -> None:
    buf = WindowedFifo(BufferConfig(window=4, max_staleness=1))
    for i, v in enumerate([0, 1, 2]):
        buf.submit(f"t{i}", policy_version=v)
        buf.complete(f"t{i}")
    out = buf.release(2, 10)
    assert _ids(out) == ["t1", "t2"]
    assert [(d.item_id, d.reason, d.staleness) for d in out.dropped] == [("t0", "stale", 2)]


def test_stale_units_are_downweighted_by_decay_per_extra_step() -> None:
    cfg = BufferConfig(window=4, max_staleness=1, stale_action=StaleAction.DOWNWEIGHT, stale_decay=0.5)
    buf = WindowedFifo(cfg)
    for i, v in enumerate([0, 1, 3]):
        buf.submit(f"t{i}", policy_version=v)
        buf.complete(f"t{i}")
    out = buf.release(4, 10)
    assert {r.item_id: r.weight for r in out.items} == {"t0": 0.125, "t1": 0.25, "t2": 1.0}
    assert out.dropped == []


def test_complete_may_lower_the_policy_version_to_the_oldest_turn() -> None:
    buf = WindowedFifo(BufferConfig(window=1, max_staleness=0))
    buf.submit("a", policy_version=3)
    buf.complete("a", policy_version=2, length=7)
    out = buf.release(3, 1)
    assert out.items == [] and out.dropped[0].length == 7 and out.dropped[0].policy_version == 2


def test_group_whole_waits_for_every_member() -> None:
    buf = WindowedFifo(BufferConfig(window=2, group_whole=True))
    for g in ("g0", "g1"):
        for k in range(2):
            buf.submit(f"{g}-{k}", group_id=g, group_size=2)
    buf.complete("g1-0")
    buf.complete("g0-0")
    assert _ids(buf.release(0, 5)) == []
    buf.complete("g1-1")
    assert _ids(buf.release(0, 5)) == ["g1-0", "g1-1"]
    buf.complete("g0-1")
    assert _ids(buf.release(0, 5)) == ["g0-0", "g0-1"]
    assert len(buf) == 0


def test_group_whole_counts_max_units_in_groups() -> None:
    buf = WindowedFifo(BufferConfig(window=3, group_whole=True))
    for g in range(3):
        for k in range(2):
            buf.submit(f"g{g}-{k}", group_id=f"g{g}", group_size=2)
            buf.complete(f"g{g}-{k}")
    assert len(buf.release(0, 2).items) == 4


def test_a_discarded_member_drops_its_whole_group() -> None:
    buf = WindowedFifo(BufferConfig(window=2, group_whole=True))
    buf.submit("a", group_id="g", group_size=2)
    buf.submit("b", group_id="g", group_size=2)
    buf.discard("a")
    assert buf.release(0, 1).dropped == []  # b still running
    buf.complete("b")
    out = buf.release(0, 1)
    assert out.items == [] and sorted(d.item_id for d in out.dropped) == ["a", "b"]
    assert {d.reason for d in out.dropped} == {"discarded"}


def test_bad_calls_raise_typed_errors() -> None:
    buf = WindowedFifo(BufferConfig(window=2))
    buf.submit("a")
    with pytest.raises(Conflict):
        buf.submit("a")
    with pytest.raises(NotFound):
        buf.complete("zz")
    buf.complete("a")
    with pytest.raises(Conflict):
        buf.complete("a")
    with pytest.raises(DataError):
        buf.release(0, 0)
    with pytest.raises(DataError):
        buf.submit("b", policy_version=-1)
    grouped = WindowedFifo(BufferConfig(window=2, group_whole=True))
    with pytest.raises(DataError):
        grouped.submit("x")
    grouped.submit("x", group_id="g", group_size=1)
    with pytest.raises(Conflict):
        grouped.submit("y", group_id="g")


def test_config_rejects_contradictory_windows() -> None:
    with pytest.raises(ValueError):
        BufferConfig(window=2, window_fraction=0.5)
    with pytest.raises(ValueError):
        BufferConfig(rule=ReleaseRule.WINDOW)


def test_checkpoint_restores_queue_times_and_payloads_through_json() -> None:
    clock = FakeClock()
    buf = WindowedFifo(BufferConfig(window=2), clock)
    _fill(buf, 3)
    clock.advance(5.0)
    buf.complete("t1", length=9)
    state = json.loads(json.dumps(buf.state_dict()))
    other = WindowedFifo(BufferConfig(rule=ReleaseRule.FIFO))
    other.load_state_dict(state)
    assert other.config == buf.config
    a, b = buf.release(0, 3), other.release(0, 3)
    assert a == b and a.items[0].completed_at == 5.0 and a.items[0].payload == {"i": 1}


def test_loading_a_malformed_state_raises_data_error() -> None:
    buf = WindowedFifo(BufferConfig(window=2))
    buf.submit("a")
    state = buf.state_dict()
    state["units"] = []
    with pytest.raises(DataError):
        WindowedFifo(BufferConfig(window=2)).load_state_dict(state)
    with pytest.raises(DataError):
        WindowedFifo(BufferConfig(window=2)).load_state_dict({"version": 99})
