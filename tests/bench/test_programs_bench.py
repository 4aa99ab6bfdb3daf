"""The programs benchmark reads the gateway's hold-time histogram as an upper-bound p99."""

from __future__ import annotations

from rollyard.bench.programs import PATHS, _hold_p99, _orders
from rollyard.gateway.metrics import GatewayMetrics


def test_hold_p99_is_the_upper_bound_of_the_bucket_holding_the_99th_percentile() -> None:
    m = GatewayMetrics()
    for v in [0.1] * 50 + [3.0] * 49 + [20.0]:
        m.hold.observe(v)
    assert _hold_p99(m.render().decode()) == 5.0
    assert _hold_p99(GatewayMetrics().render().decode()) == 0.0  # nothing held


def test_every_path_runs_first_and_last_in_some_round_extras_included() -> None:
    paths = (*PATHS, "fifo,router=cost_aware")
    orders = _orders(4, paths)
    assert all(sorted(o) == sorted(paths) for o in orders)
    assert {o[0] for o in orders} >= {"direct", "fifo,router=cost_aware"}
    assert len({o[-1] for o in orders}) >= 2
