"""The programs benchmark reads the gateway's hold-time histogram as an upper-bound p99."""

from __future__ import annotations

from rollyard.bench.programs import _hold_p99
from rollyard.gateway.metrics import GatewayMetrics


def test_hold_p99_is_the_upper_bound_of_the_bucket_holding_the_99th_percentile() -> None:
    m = GatewayMetrics()
    for v in [0.1] * 50 + [3.0] * 49 + [20.0]:
        m.hold.observe(v)
    assert _hold_p99(m.render().decode()) == 5.0
    assert _hold_p99(GatewayMetrics().render().decode()) == 0.0  # nothing held
