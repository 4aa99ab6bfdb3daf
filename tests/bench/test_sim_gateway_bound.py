"""``rollyard bench sim``'s gateway-bound part, small: a real gateway pinned to one core in front of
the canned engine, calibrated before each level, each level live and replayed."""

from __future__ import annotations

import math

import pytest

from rollyard.bench import _sim_gateway


@pytest.mark.slow
def test_each_level_is_calibrated_then_run_live_and_replayed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sim_gateway, "LEVELS", (8, 16))
    out = _sim_gateway.gateway_bound(turns=2)
    assert set(out["levels"]) == {8, 16}
    for level in out["levels"].values():
        assert level["gateway"]["source"].startswith("pinned to core")
        assert level["live_tok_s"] > 0 and level["sim_tok_s"] > 0
        assert level["live_cpu_ms_per_req"] > 0 and level["sim_cpu_ms_per_req"] > 0
        assert math.isfinite(level["err_thr"])
    # a calibration of its own before each level (two measurements never fit to the same floats)
    assert out["levels"][8]["gateway"] != out["levels"][16]["gateway"]
    assert out["err_thr_gateway_bound"] == max(v["err_thr"] for v in out["levels"].values())
    assert out["request_s"] > 0
