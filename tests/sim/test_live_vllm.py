"""The simulator against the real thing: a small workload played through a real gateway and
vLLM by scripted clients, then replayed in the simulator from the recorded trace."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.bench._procs import _gateway
from rollyard.bench._sim_live import run_live
from rollyard.sched import make_policy
from rollyard.sim import Simulation, load_workload
from rollyard.sim.calibrate import calibrate

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_a_live_run_replays_in_the_simulator_with_the_same_tokens(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    """The engine is calibrated here, on this machine, first: the committed ``cpu-tiny`` profile
    was measured on another machine, and CI machines differ by several times in speed."""
    profile = calibrate(vllm_url, name="here", path=tmp_path / "here.yaml", quick=True)
    w = load_workload("cpu-small", programs=8)
    plans = w.plans()
    with _gateway(vllm_url, tiny_model_dir, ["--policy", "thunder"]) as (gw_url, _):
        live = run_live(gw_url, vllm_url, plans)
    # ignore_eos through the gateway: every turn produced exactly the planned output
    assert [t.output_tokens for p in live.plans for t in p.turns] == [
        t.output_tokens for p in plans for t in p.turns
    ]
    assert live.output_tokens == sum(t.output_tokens for p in plans for t in p.turns)
    # the trace carries what the gateway reported: contexts grow turn by turn
    for p in live.plans:
        prompts = [t.prompt_tokens for t in p.turns]
        assert prompts == sorted(prompts) and prompts[0] > 0
    r = Simulation(w, make_policy("thunder"), profile, plans=live.plans).run()
    assert r.stats.output_tokens == live.output_tokens
    assert len(r.stats.request_latency) == len(live.request_latency)
    ratio = r.summary["output_tok_s"] / live.summary()["output_tok_s"]
    assert 1 / 3 < ratio < 3, ratio  # a sanity bound; the accuracy is `rollyard bench sim`'s figure
