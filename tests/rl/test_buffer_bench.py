"""The buffer benchmark's simulation: conservation and the rules' qualitative order."""

from __future__ import annotations

from rollyard.bench.buffer import RULES, SimParams, simulate
from rollyard.rl.buffer import BufferConfig


def test_simulation_consumes_exactly_steps_times_batch_with_sane_metrics() -> None:
    p = SimParams(generators=16, batch=4, capacity=32, steps=30)
    for name, cfg in RULES.items():
        r = simulate(cfg, p)
        assert r["consumed"] == p.steps * p.batch, name
        assert 0.0 <= r["idle_frac"] <= 1.0 and r["staleness_mean"] >= 0 and r["short_bias"] > 0
        assert r["queued_at_end"] <= p.capacity


def test_staleness_bound_caps_what_the_trainer_consumes() -> None:
    p = SimParams(generators=16, batch=4, capacity=32, steps=30)
    r = simulate(BufferConfig(window=8, max_staleness=1), p)
    assert r["staleness_max"] <= 1


def test_a_wider_window_never_idles_the_trainer_more_than_strict_fifo_here() -> None:
    p = SimParams(generators=16, batch=4, capacity=32, steps=40, seed=3)
    fifo = simulate(RULES["fifo"], p)
    window = simulate(BufferConfig(window=16), p)
    assert window["idle_frac"] <= fifo["idle_frac"]
