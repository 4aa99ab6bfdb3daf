"""What a cluster run pays beside the engines: the gateway as a queue of CPU servers, the
trainer's step from its FLOPs, publication and its fence; the shipped Qwen profiles; the
report's keys; the gateway fit."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rollyard.cli import _register, app
from rollyard.core.errors import ConfigError
from rollyard.sched import make_policy
from rollyard.sim import Simulation, load_profile, profile_names
from rollyard.sim.bounds import sized
from rollyard.sim.calibrate import fit_gateway
from rollyard.sim.costs import GatewayCost, PublishCost, TrainerCost, shards_needed
from rollyard.sim.engine import EngineRequest, SimEngine
from rollyard.sim.profile import EngineProfile, load_gateway, write_yaml
from rollyard.sim.report import write_report
from rollyard.sim.workload import ProgramPlan, Turn, Workload

ENGINE: dict[str, Any] = dict(
    name="t", overhead_s=0.001, per_token_s=1e-6, block_size=16, num_blocks=4096, max_model_len=2048
)  # a fast engine: the gateway is what these runs wait for


def profile(**sections: Any) -> EngineProfile:
    return EngineProfile.model_validate({**ENGINE, **sections})


def workload(**kw: Any) -> Workload:
    base: dict[str, Any] = dict(
        name="t", programs=16, group_size=1, engines=2, seed=3, turns={"value": 1},
        prompt_tokens={"value": 100}, output_tokens={"value": 4}, max_context=2048,
    )  # fmt: skip
    base.update(kw)
    return Workload.model_validate(base)


def arrivals(n: int, every_s: float) -> list[ProgramPlan]:
    """``n`` one-turn programs, the i-th sending its request at ``i * every_s``."""
    return [ProgramPlan(f"p{i}", f"g{i}", 1, [Turn(100, 4, 0.0, 0)], start_s=i * every_s) for i in range(n)]


# ---- the gateway as a queue ----------------------------------------------------------------


def test_under_capacity_the_gateway_is_busy_arrival_rate_times_service_over_servers() -> None:
    # D/D/c: a request every 10 ms, 4 ms of CPU each (2 in, 2 back), 1 shard of 2 cores:
    # rho = (1/0.010) * 0.004 / 2 = 0.2, and no request ever waits for a core.
    cost = GatewayCost(base_s=0.004, shards=1, cores_per_shard=2)
    n, every = 200, 0.010
    r = Simulation(
        workload(programs=n), make_policy("fifo"), profile(gateway=cost), plans=arrivals(n, every)
    ).run()
    s = r.summary
    rho = (1 / every) * cost.request_s(100, 4) / cost.servers
    arrival_span = (n - 1) * every
    assert s["gateway_cpu_s"] == pytest.approx(n * 0.004)
    assert s["gateway_util"] * s["makespan_s"] / arrival_span == pytest.approx(rho, rel=0.02)
    assert s["gateway_wait_p99_s"] == 0.0


def test_over_capacity_the_gateway_sets_the_pace_and_shards_multiply_it() -> None:
    # 400 requests at once, 10 ms of CPU each: c cores finish them in 400 * 0.010 / c seconds.
    n = 400
    spans = {}
    for shards in (1, 2, 4):
        cost = GatewayCost(base_s=0.010, shards=shards)
        r = Simulation(workload(programs=n), make_policy("fifo"), profile(gateway=cost)).run()
        spans[shards] = r.summary["makespan_s"]
        assert r.summary["gateway_util"] > 0.9
    assert spans[1] == pytest.approx(n * 0.010, rel=0.02)
    # a program stays on its shard (a hash of its id), so shards split the work only roughly evenly
    assert spans[2] == pytest.approx(spans[1] / 2, rel=0.15)
    assert spans[4] == pytest.approx(spans[1] / 4, rel=0.25)


def test_prompt_and_streamed_tokens_cost_what_the_coefficients_say() -> None:
    cost = GatewayCost(
        base_s=0.002, per_prompt_token_s=1e-5, per_output_token_s=1e-6, per_stream_token_s=1e-4
    )
    assert cost.in_s(1000) == pytest.approx(0.001 + 0.01)
    assert cost.out_s(100) == pytest.approx(0.001 + 1e-4)
    streamed = cost.model_copy(update={"stream": True})
    assert streamed.out_s(100) == pytest.approx(0.001 + 0.01)
    n = 50
    whole = Simulation(workload(programs=n), make_policy("fifo"), profile(gateway=cost)).run()
    stream = Simulation(workload(programs=n), make_policy("fifo"), profile(gateway=streamed)).run()
    # each program: one turn of a 100-token prompt and 4 output tokens
    assert whole.summary["gateway_cpu_s"] == pytest.approx(n * cost.request_s(100, 4))
    assert stream.summary["gateway_cpu_s"] == pytest.approx(n * streamed.request_s(100, 4))


def test_the_shard_rule_is_work_over_seventy_percent_of_the_cores_and_sizing_finds_it() -> None:
    assert shards_needed(70.0, 100.0, 1) == 1
    assert shards_needed(70.1, 100.0, 1) == 2
    assert shards_needed(140.0, 100.0, 2) == 1
    assert shards_needed(0.0, 100.0, 1) == 1
    # multi-turn programs with tool gaps: the engines and tools set the pace when shards suffice
    w = workload(
        programs=64, engines=2, turns={"value": 8}, tool_s={"dist": "exponential", "mean": 2.0},
        tool_tokens={"value": 20},
    )  # fmt: skip
    prof = profile(gateway=GatewayCost(base_s=0.03, per_prompt_token_s=1e-5))
    at, need = sized(w, "fifo", prof)
    s = at.summary
    assert s["gateway_shards"] == need and s["gateway_util"] <= 0.7
    # at least what the work asks for at the pace the engines and tools set (no request waits
    # for a core), and the run at that count is within 5% of that pace
    wide = Simulation(w, make_policy("fifo"), prof.with_costs(shards=1024)).run().summary
    assert wide["gateway_wait_p99_s"] == 0.0
    assert need >= shards_needed(wide["gateway_cpu_s"], wide["makespan_s"], 1)
    assert s["makespan_s"] <= 1.05 * wide["makespan_s"]
    # one shard fewer (here: at 64% busy, within the rule) the gateway paces the run
    assert need > 1
    fewer = Simulation(w, make_policy("fifo"), prof.with_costs(shards=need - 1)).run().summary
    assert fewer["makespan_s"] > 1.05 * wide["makespan_s"] or fewer["gateway_shards_needed"] > need - 1


# ---- the trainer and publication ------------------------------------------------------------

TRAINER = TrainerCost(params=1e9, gpus=2, peak_flops=1e14, mfu=0.5)


def sync_workload() -> Workload:
    return workload(
        programs=24, group_size=4, engines=2, turns={"dist": "uniform", "low": 2, "high": 4},
        prompt_tokens={"dist": "uniform", "low": 100, "high": 300}, output_tokens={"value": 20},
        tool_tokens={"value": 30}, tool_s={"value": 0.1},
        rl={"mode": "sync", "batch_groups": 6, "buffer": {"rule": "fifo", "group_whole": True}},
    )  # fmt: skip


def test_a_step_trains_the_batchs_tree_merged_tokens_at_six_flops_per_parameter() -> None:
    w = sync_workload()  # 6 groups, one step of all of them
    r = Simulation(w, make_policy("fifo"), profile(trainer=TRAINER)).run()
    merged = 0
    plans = w.plans()
    for gid in {p.group_id for p in plans}:
        members = [p for p in plans if p.group_id == gid]
        task = members[0].turns[0].prompt_tokens
        merged += task + sum(p.turns[-1].prompt_tokens + p.turns[-1].output_tokens - task for p in members)
    assert r.stats.trained_tokens == merged
    assert r.summary["train_step_s"] == pytest.approx(6 * 1e9 * merged / (2 * 1e14 * 0.5))


def test_publication_adds_stage_and_fence_to_each_sync_step() -> None:
    w = sync_workload().model_copy(update={"programs": 48})  # two steps of 6 groups
    pub = PublishCost(
        mode="disk", bytes=4e9, disk_write_bw=2e9, disk_read_bw=1e9, storage_bw=1.6e9, swap_s=0.1
    )
    assert pub.stage_s() == pytest.approx(2.0)
    assert pub.fence_s(2) == pytest.approx(max(4.0, 2 * 4e9 / 1.6e9) + 0.1)  # the storage binds: 5 s
    none = Simulation(w, make_policy("fifo"), profile(trainer=TRAINER)).run()
    disk = Simulation(w, make_policy("fifo"), profile(trainer=TRAINER, publish=pub)).run()
    mem = pub.model_copy(update={"mode": "memory", "memory_bw": 8e9})
    memory = Simulation(w, make_policy("fifo"), profile(trainer=TRAINER, publish=mem)).run()
    # the second step's rollouts wait for the first step's publication, nothing else changes
    assert disk.summary["makespan_s"] - none.summary["makespan_s"] == pytest.approx(pub.publish_s(2))
    assert memory.summary["makespan_s"] - none.summary["makespan_s"] == pytest.approx(0.5 + 0.1)
    step = disk.summary["train_step_s"]
    assert disk.summary["publish_share"] == pytest.approx(pub.publish_s(2) / (step + pub.publish_s(2)))
    assert memory.summary["publish_share"] < disk.summary["publish_share"]


def test_a_fenced_engine_finishes_the_step_under_way_then_waits_for_the_weights() -> None:
    e = SimEngine("e", profile())
    e.add(EngineRequest("r", "p", 16, 50, 0.0), 0.0)
    end = e.plan(0.0)
    assert end is not None
    e.finish(end)  # the prefill step; now a run of decode steps
    run_end = e.plan(end)
    assert run_end is not None and e.run is not None and e.run.k > 1
    cut = e.fence(end + 0.0015)
    assert cut is not None and end < cut < run_end  # the run stops at the step in progress
    e.finish(cut)
    assert e.plan(cut) is None  # fenced: no next step, though the request is not done
    e.fenced = False
    assert e.plan(cut + 1.0) is not None


def test_trainer_idle_and_staleness_come_out_of_the_trainers_speed() -> None:
    w = workload(  # 4 groups at a time: they finish in waves, each wave a batch
        programs=96, group_size=4, concurrency=16, engines=2, turns={"value": 3},
        prompt_tokens={"value": 200}, output_tokens={"value": 30}, tool_tokens={"value": 20},
        tool_s={"value": 0.2},
        rl={"mode": "async", "batch_groups": 4,
            "buffer": {"rule": "window", "window_fraction": 0.5, "group_whole": True, "max_staleness": 8}},
    )  # fmt: skip
    slow_trainer = TRAINER.model_copy(update={"params": 3e10, "gpus": 1})
    fast = Simulation(w, make_policy("fifo"), profile(trainer=TRAINER.model_copy(update={"gpus": 64}))).run()
    slow = Simulation(w, make_policy("fifo"), profile(trainer=slow_trainer)).run()
    assert fast.summary["trainer_idle"] > slow.summary["trainer_idle"]
    assert fast.summary["train_step_s"] < slow.summary["train_step_s"]
    assert fast.summary["trainer_steps"] > slow.summary["trainer_steps"]


# ---- profiles, reports, the CLI, the fit ----------------------------------------------------


@pytest.mark.parametrize("name", [n for n in profile_names() if "qwen" in n])
def test_the_qwen_profiles_load_derived_and_scale_with_tensor_parallelism(name: str) -> None:
    p = load_profile(name)
    tp = int(name.rsplit("tp", 1)[1])
    assert p.tensor_parallel == tp and "DERIVED" in p.source
    assert p.gateway is not None and p.trainer is not None and p.publish is not None
    assert p.publish.bytes == pytest.approx(2 * p.trainer.params)  # bf16 weights
    matmul = 2 * p.trainer.params / (tp * 0.5 * 989e12)  # the derivation's per-token matmul
    if tp == 1:
        assert p.per_token_s == pytest.approx(matmul, rel=1e-3)
    else:  # plus the all-reduces between the GPUs
        assert matmul < p.per_token_s < 1.5 * matmul
    if tp > 1:  # half the GPUs, about twice the per-token cost
        half = load_profile(name.rsplit("tp", 1)[0] + f"tp{tp // 2}")
        assert 1.6 < half.per_token_s / p.per_token_s < 2.0
        assert p.kv_tokens > half.kv_tokens


def test_a_32b_model_on_one_h100_has_no_room_for_a_32k_context() -> None:
    p = load_profile("h100-qwen32b-tp1")
    assert p.kv_tokens < 32768 and p.max_model_len == 8192


def test_a_gateway_cost_file_round_trips_and_a_bad_one_is_a_clear_error(tmp_path: Path) -> None:
    cost = GatewayCost(base_s=0.001, per_prompt_token_s=2e-7, per_stream_token_s=3e-5, source="x")
    path = tmp_path / "gw.yaml"
    write_yaml(path, cost.model_dump(mode="json"), "a comment")
    assert load_gateway(path) == cost
    (tmp_path / "bad.yaml").write_text("base_s: -1\n")
    with pytest.raises(ConfigError, match="invalid"):
        load_gateway(tmp_path / "bad.yaml")
    with pytest.raises(ConfigError, match="no gateway cost"):
        profile().with_costs(shards=2)


def test_the_report_shows_gateway_utilisation_publish_share_and_trainer_idle(tmp_path: Path) -> None:
    w = sync_workload()
    pub = PublishCost(bytes=1e9)
    prof = profile(gateway=GatewayCost(base_s=0.002), trainer=TRAINER, publish=pub)
    r = Simulation(w, make_policy("fifo"), prof).run()
    text = write_report(tmp_path, [r]).read_text()
    header = text.splitlines()[2]
    for key in ("output_tok_s", "gateway_util", "publish_share", "trainer_idle", "train_step_s"):
        assert key in header
        assert isinstance(r.summary[key], float) and not math.isnan(r.summary[key])


def test_the_cli_prints_the_gateway_shards_that_keep_utilisation_under_seventy_percent(
    tmp_path: Path,
) -> None:
    _register()
    gw = tmp_path / "gw.yaml"
    write_yaml(gw, GatewayCost(base_s=0.02, per_prompt_token_s=1e-5).model_dump(mode="json"))
    out = CliRunner().invoke(
        app, ["sim", "swe", "--engines", "4", "--programs", "64", "--profile", "h100-qwen7b-tp1",
              "--gateway-cost", str(gw), "--out", str(tmp_path / "r")],
    )  # fmt: skip
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if "gateway_shards_needed=" in x)
    need = int(line.split("gateway_shards_needed=")[1].split()[0])
    util = float(line.split("util=")[1].split(",")[0])
    assert need >= 1 and util <= 0.7


def test_bounds_sizes_the_gateway_and_runs_both_publish_modes(tmp_path: Path) -> None:
    _register()
    small = tmp_path / "small.yaml"  # swe's shape, small: batches of 2 groups, so steps publish mid-run
    write_yaml(small, {
        "name": "small", "programs": 48, "group_size": 4, "turns": {"dist": "uniform", "low": 3, "high": 6},
        "prompt_tokens": {"value": 2000}, "output_tokens": {"value": 100}, "tool_tokens": {"value": 300},
        "tool_s": {"value": 1.0}, "rl": {"mode": "async", "batch_groups": 2},
    })  # fmt: skip
    args = ["sim", "bounds", "--workload", str(small), "--gpus", "8", "-p", "fifo",
            "--bounds-profile", "h100-qwen7b-tp4", "--bounds-profile", "h100-qwen14b-tp4",
            "--out", str(tmp_path / "b.md")]  # fmt: skip
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    rows = [line.split("|")[1:-1] for line in (tmp_path / "b.md").read_text().splitlines()[2:]]
    assert [r[0].strip() for r in rows] == ["h100-qwen7b-tp4", "h100-qwen14b-tp4"]
    for r in rows:
        assert int(r[1]) == 2 and int(r[3]) >= 1  # 8 GPUs hold two 4-GPU engines; shards sized
        disk, memory = (float(x) for x in r[5].split("/"))
        assert disk > memory > 0  # publishing from disk takes a larger share of a step
        assert r[8].strip() in {
            "trainer / trainer",
            "engines / engines",
            "trainer / engines",
            "engines / trainer",
        }


def test_the_gateway_fit_recovers_the_cost_it_was_given() -> None:
    truth = {
        "base_s": 1e-3,
        "per_prompt_token_s": 3e-7,
        "per_new_token_s": 2e-6,
        "per_output_token_s": 2e-6,
        "per_stream_token_s": 3e-5,
    }
    points = []
    for prompt, new in ((100, 100), (2000, 700), (8000, 700), (16000, 16000)):
        for out, stream in ((32, False), (256, False), (32, True), (256, True)):
            per = truth["per_stream_token_s"] if stream else truth["per_output_token_s"]
            cost = truth["base_s"] + truth["per_prompt_token_s"] * prompt + truth["per_new_token_s"] * new
            points.append((float(prompt), float(new), float(out), stream, cost + per * out))
    got = fit_gateway(points)
    for k, v in truth.items():
        assert got[k] == pytest.approx(v, rel=1e-6)
