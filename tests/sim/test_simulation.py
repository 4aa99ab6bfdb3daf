"""The whole simulator: seeded runs repeat, sched policies decide as in their unit tests,
engine failures re-route, RL modes train, bad input is a clear error."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollyard.core.errors import ConfigError
from rollyard.sched import Start, make_policy
from rollyard.sim import Simulation, load_profile, load_workload, workload_names
from rollyard.sim.profile import EngineProfile
from rollyard.sim.report import write_report
from rollyard.sim.workload import Workload

PROFILE = EngineProfile(
    name="t", overhead_s=0.01, per_token_s=1e-4, decode_attn_s=1e-7, prefill_attn_s=1e-8,
    block_size=16, num_blocks=256, max_model_len=2048,
)  # fmt: skip


def workload(**kw: Any) -> Workload:
    base: dict[str, Any] = dict(
        name="t", programs=24, group_size=4, engines=3, seed=1,
        turns={"dist": "uniform", "low": 2, "high": 6},
        prompt_tokens={"dist": "lognormal", "median": 300, "sigma": 0.3},
        output_tokens={"dist": "lognormal", "median": 40, "sigma": 1.0, "max": 400},
        tool_tokens={"dist": "const", "value": 60}, tool_s={"dist": "exponential", "mean": 1.0},
        max_context=2048,
    )  # fmt: skip
    base.update(kw)
    return Workload.model_validate(base)


def test_a_seeded_simulation_is_deterministic() -> None:
    w = workload(failures=[{"engine": 1, "at_s": 3.0, "down_s": 5.0}])
    a = Simulation(w, make_policy("fifo"), PROFILE, record=True).run()
    b = Simulation(w, make_policy("fifo"), PROFILE, record=True).run()
    drop = {"wall_s"}
    assert {k: v for k, v in a.summary.items() if k not in drop} == {
        k: v for k, v in b.summary.items() if k not in drop
    }
    assert a.decisions == b.decisions
    c = Simulation(workload(seed=2), make_policy("fifo"), PROFILE).run()
    assert c.summary["output_tok_s"] != a.summary["output_tok_s"]


def test_fifo_starts_requests_in_arrival_order_as_its_unit_test_says() -> None:
    # tests/sched: one engine of capacity 1, three programs -> r0, r1, r2, each after the last ends.
    w = workload(programs=3, group_size=1, engines=1, gateway_capacity=1, turns={"value": 1})
    r = Simulation(w, make_policy("fifo"), PROFILE, record=True).run()
    starts = [(t, d) for t, d in r.decisions if isinstance(d, Start)]
    assert [d.program_id for _, d in starts] == ["p0.0", "p1.0", "p2.0"]
    assert starts[0][0] == 0.0 and 0.0 < starts[1][0] < starts[2][0]
    assert [d.waited_s for _, d in starts] == [0.0, starts[1][0], starts[2][0]]


def test_equal_kv_spreads_programs_across_engines_as_its_unit_test_says() -> None:
    w = workload(programs=4, group_size=1, engines=2, turns={"value": 1})
    r = Simulation(w, make_policy("fifo"), PROFILE, record=True).run()
    engines = [d.engine for _, d in r.decisions if isinstance(d, Start)]
    assert sorted(engines) == ["e0", "e0", "e1", "e1"]


def test_a_failed_engines_programs_retry_on_another_and_say_where_from() -> None:
    w = workload(failures=[{"engine": 0, "at_s": 2.0}])
    r = Simulation(w, make_policy("fifo"), PROFILE, record=True).run()
    assert r.summary["failed_requests"] > 0
    moved = [d for t, d in r.decisions if isinstance(d, Start) and d.moved_from == "e0"]
    assert moved and all(d.engine != "e0" for d in moved)
    assert not [d for t, d in r.decisions if isinstance(d, Start) and d.engine == "e0" and t > 2.0]
    assert r.summary["programs"] == 24


def test_kv_pressure_preempts() -> None:
    tight = PROFILE.model_copy(update={"num_blocks": 130})
    r = Simulation(workload(engines=1), make_policy("fifo"), tight).run()
    assert r.summary["preemptions"] > 0 and r.summary["recomputed_tokens"] > 0


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_rl_modes_train_through_the_buffer(mode: str) -> None:
    rl = {"mode": mode, "batch_groups": 2, "train_s": 0.5}
    r = Simulation(workload(rl=rl, concurrency=12), make_policy("fifo"), PROFILE).run()
    assert r.summary["trainer_steps"] >= 2
    if mode == "sync":
        assert r.summary["staleness_mean"] == 0.0  # a sync step trains on its own rollouts


def test_shipped_workloads_load_and_run_small(tmp_path: Path) -> None:
    assert set(workload_names()) >= {"swe", "search", "math"}
    for name in workload_names():
        w = load_workload(name, programs=64, engines=2)
        r = Simulation(w, make_policy("fifo"), load_profile(w.profile)).run()
        assert r.summary["programs"] == 64
        summary = write_report(tmp_path / name, [r])
        assert "| fifo |" in summary.read_text()
        assert (tmp_path / name / "kv_usage.png").stat().st_size > 0


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown workload"):
        load_workload("nope")
    bad = tmp_path / "w.yaml"
    bad.write_text("name: x\nprograms: 3\ngroup_size: 2\nprompt_tokens: {}\noutput_tokens: {}\n")
    with pytest.raises(ConfigError, match="multiple of group_size"):
        load_workload(bad)
    with pytest.raises(ConfigError, match="unknown engine profile"):
        load_profile("nope")
    with pytest.raises(ConfigError, match="max_context"):
        Simulation(workload(max_context=4096), make_policy("fifo"), PROFILE)


def test_thunder_pauses_and_restores_in_the_simulator_as_its_unit_test_says() -> None:
    # tests/sched/test_thunder.py: over capacity, acting programs are paused smallest-first
    # until the rest fit; a paused program's next request is held; it is restored once room frees.
    from rollyard.sched import Pause, Restore
    from rollyard.sim.workload import ProgramPlan, Turn

    prof = PROFILE.model_copy(update={"num_blocks": 64, "max_model_len": 1024})  # 1024 KV tokens
    plans = [  # all three fit when placed (900 tokens); "big" grows to 620 with a tool result
        ProgramPlan("small", "small", 1, [Turn(200, 10, 20.0, 0), Turn(210, 10, 0.0, 0)]),
        ProgramPlan("mid", "mid", 1, [Turn(300, 10, 20.0, 0), Turn(310, 10, 0.0, 0)]),
        ProgramPlan(
            "big", "big", 1, [Turn(400, 10, 2.0, 200), Turn(610, 10, 20.0, 0), Turn(620, 10, 0.0, 0)]
        ),
    ]
    w = workload(programs=3, group_size=1, engines=1, max_context=1024)
    r = Simulation(w, make_policy("thunder", buffer_tokens=0), prof, plans=plans, record=True).run()
    ticks = [(t, d) for t, d in r.decisions if isinstance(d, Pause | Restore)]
    # first tick (t=5): all act, 210 + 310 + 620 = 1140 > 1024: the smallest actor pauses, 930 fits
    assert ticks[0] == (5.0, Pause("small", "e0"))
    # "small" asks for its second turn at ~20 s: held; "mid" ends at ~20 s; the next tick restores
    t_restore, restore = ticks[1]
    assert t_restore == 25.0 and isinstance(restore, Restore) and restore.program_id == "small"
    small_starts = [t for t, d in r.decisions if isinstance(d, Start) and d.program_id == "small"]
    assert small_starts[1] == 25.0
    assert len(ticks) == 2 and r.summary["pauses"] == 1


def test_a_replay_follows_the_live_clock_tick_phase_and_program_starts() -> None:
    # The three programs above, replayed as a live trace: the gateway had been up 3.5 s when
    # the run began, so it had polled the idle engine (t=0 knows it) and polls every 2 s from
    # then (0.5, 2.5, ...), and its 5 s ticks fall at 1.5, 6.5, ... of the run: at 1.5 "big"
    # has not grown yet, so "small" is paused at 6.5 and restored at 21.5 (not 5 and 25).
    from rollyard.sched import Pause, Restore
    from rollyard.sim.workload import ProgramPlan, Turn

    prof = PROFILE.model_copy(update={"num_blocks": 64, "max_model_len": 1024})
    plans = [
        ProgramPlan("small", "small", 1, [Turn(200, 10, 20.0, 0), Turn(210, 10, 0.0, 0)]),
        ProgramPlan("mid", "mid", 1, [Turn(300, 10, 20.0, 0), Turn(310, 10, 0.0, 0)]),
        ProgramPlan(
            "big", "big", 1, [Turn(400, 10, 2.0, 200), Turn(610, 10, 20.0, 0), Turn(620, 10, 0.0, 0)]
        ),
    ]
    w = workload(programs=3, group_size=1, engines=1, max_context=1024)
    policy = make_policy("thunder", buffer_tokens=0)
    r = Simulation(w, policy, prof, plans=plans, record=True, shell_up_s=3.5).run()
    ticks = [(t, d) for t, d in r.decisions if isinstance(d, Pause | Restore)]
    assert ticks[0] == (6.5, Pause("small", "e0"))
    assert ticks[1][0] == 21.5 and isinstance(ticks[1][1], Restore) and len(ticks) == 2
    assert [t for t, d in r.decisions if isinstance(d, Start)][:3] == [0.0, 0.0, 0.0]
    assert [t for t, *_ in r.stats.series][:4] == [0.0, 0.5, 2.5, 4.5]
    # a program's first request goes out when the trace says it did
    late = [ProgramPlan("late", "late", 1, [Turn(16, 2, 0.0, 0)], start_s=3.0)]
    one = workload(programs=1, group_size=1, engines=1)
    r = Simulation(one, make_policy("fifo"), PROFILE, plans=late, record=True, shell_up_s=3.5).run()
    assert [t for t, d in r.decisions if isinstance(d, Start)] == [3.0]


def test_divided_rollout_runs_a_turn_as_chunks_that_keep_the_program_reasoning() -> None:
    w = workload(programs=4, group_size=4, engines=2, divide_tokens=16, output_tokens={"value": 50})
    r = Simulation(w, make_policy("seer"), PROFILE, record=True).run()
    starts = [d for _, d in r.decisions if isinstance(d, Start)]
    whole = Simulation(w.model_copy(update={"divide_tokens": 0}), make_policy("seer"), PROFILE).run()
    assert r.summary["output_tok_s"] > 0 and r.stats.output_tokens == whole.stats.output_tokens
    assert len(starts) > 3 * len(whole.stats.request_latency)  # 50 tokens = 4 chunks of <= 16
    assert len(r.stats.request_latency) == len(whole.stats.request_latency)  # a turn is still one request


def test_a_correlated_group_spreads_its_members_below_one_longest_answer() -> None:
    w = workload(programs=400, group_size=8, turns={"value": 1}, group_spread=1.0, max_context=32768,
                 output_tokens={"dist": "lognormal", "median": 400, "sigma": 1.0, "min": 4})  # fmt: skip
    plans = w.plans()
    assert plans == w.plans()  # seeded
    by_group: dict[str, list[int]] = {}
    for p in plans:
        by_group.setdefault(p.group_id, []).append(p.turns[0].output_tokens)
    tops = [max(v) for v in by_group.values()]
    for outs in by_group.values():
        assert all(max(4, max(outs) / 10) - 1 <= o <= max(outs) for o in outs)  # within one decade
    # the longest member is at a random place, not always first
    assert len({outs.index(max(outs)) for outs in by_group.values()}) > 4
    # groups differ ~10x (sigma 1), members within one: a sibling's length says much of its group's
    assert max(tops) / min(tops) > 20
    # off (the default), the same programs' answers are drawn independently, as before
    same = workload(programs=400, group_size=8, turns={"value": 1},
                    output_tokens={"dist": "lognormal", "median": 400, "sigma": 1.0, "min": 4})  # fmt: skip
    assert [p.turns for p in same.plans()] != [p.turns for p in plans]
    assert [p.turns for p in same.plans()] == [p.turns for p in workload(
        programs=400, group_size=8, turns={"value": 1}, group_spread=0.0,
        output_tokens={"dist": "lognormal", "median": 400, "sigma": 1.0, "min": 4}).plans()]  # fmt: skip


def test_seer_beats_group_binding_where_the_kv_cache_binds() -> None:
    """docs/seer.md's simulated claim, on the shipped workload: with the H100 profile's own KV
    (~400k tokens) every sample fits and the gain is small; with 40k tokens an engine holds few
    long contexts, a bound group preempts itself, and Seer's divided placement pays off."""
    w = load_workload("seer", divide_tokens=2048)
    base = load_workload("seer")

    def gain(kv: int | None) -> float:
        prof = load_profile(w.profile)
        prof = prof.with_kv_tokens(kv) if kv else prof
        bound = Simulation(base, make_policy("group_bound"), prof).run().summary["output_tok_s"]
        return Simulation(w, make_policy("seer"), prof).run().summary["output_tok_s"] / bound

    assert gain(None) < 1.25
    assert gain(40_000) > 1.5


def test_the_cli_compares_policies_into_a_report_directory(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rollyard.cli import _register, app

    _register()
    out = tmp_path / "rep"
    args = ["sim", "cpu-small", "--programs", "8", "-p", "fifo", "-p", "thunder", "--out", str(out)]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "fifo: output_tok_s=" in res.output and "thunder: output_tok_s=" in res.output
    table = (out / "summary.md").read_text()
    assert "| fifo |" in table and "| thunder |" in table
    assert (out / "throughput.png").exists() and (out / "results.json").exists()
    bad = CliRunner().invoke(app, ["sim", "cpu-small", "-p", "nope"])
    assert bad.exit_code != 0
    kv = ["--kv-tokens", "40000", "-p", "fifo", "--out", str(tmp_path / "kv")]
    small = CliRunner().invoke(app, ["sim", "seer", "--programs", "64", "--engines", "2", *kv])
    assert small.exit_code == 0, small.output
    assert "2 x h100-llama8b-kv40000" in (tmp_path / "kv" / "summary.md").read_text()
    too_small = CliRunner().invoke(app, ["sim", "seer", "--kv-tokens", "1000"])
    assert too_small.exit_code != 0 and "max_model_len" in str(too_small.exception)
