"""``rollyard bench sim``'s pieces that need no engine: the pressure workload really presses
on the KV cache, the validation workloads rank the policies the same at any engine speed near
the calibrated one, and the ranking check."""

from __future__ import annotations

import pytest

from rollyard.bench.sim import rank_ok, rank_strict
from rollyard.sched import make_policy
from rollyard.sim import Simulation, load_profile, load_workload
from rollyard.sim.profile import EngineProfile


def test_the_pressure_workload_oversubscribes_the_kv_cache_and_separates_the_policies() -> None:
    w = load_workload("cpu-pressure")
    profile = load_profile(w.profile)
    plans = w.plans()
    last = sum(p.turns[-1].prompt_tokens + p.turns[-1].output_tokens for p in plans)
    assert last > 3 * profile.kv_tokens  # every program's final context, against 16k KV tokens
    assert max(t.prompt_tokens + t.output_tokens for p in plans for t in p.turns) < profile.max_model_len
    runs = {}
    for name in ("fifo", "rollyard", "thunder"):
        runs[name] = Simulation(w, make_policy(name), profile).run()
    fifo = runs["fifo"]
    assert max(peak for _, _, peak, *_ in fifo.stats.series) > 0.9  # FIFO fills the cache
    assert runs["thunder"].summary["pauses"] > 0 and runs["rollyard"].summary["pauses"] > 0
    thr = {n: r.summary["output_tok_s"] for n, r in runs.items()}
    gaps = sorted(abs(thr[a] - thr[b]) / max(thr[a], thr[b]) for a in thr for b in thr if a < b)
    # with the committed (quiet-machine) profile: every pair > 3% apart, the widest > 8%
    # (2026-12-03: fifo 494, rollyard 515, thunder 471 tok/s; live 477 / 513 / 411 that morning)
    assert gaps[0] > 0.03 and gaps[-1] > 0.08, thr


def _slower(profile: EngineProfile, factor: float) -> EngineProfile:
    """The same engine with every step ``factor`` times as long."""
    terms = ("overhead_s", "per_token_s", "per_seq_s", "decode_attn_s", "prefill_attn_s")
    return profile.model_copy(update={k: getattr(profile, k) * factor for k in terms})


@pytest.mark.parametrize("name", ["cpu-small", "cpu-pressure"])
def test_the_validation_workloads_rank_the_policies_alike_at_any_nearby_engine_speed(name: str) -> None:
    """A validation workload must not hinge on the engine's speed to a few percent: a quick
    calibration is that far off, and the live engine moves that much between rounds. cpu-small
    with 32 programs did: thunder's claims peaked at the cache itself, so its first tick paused
    7 programs or none by a 5% faster engine or a tick a second later (502 or 733 tok/s). Now
    thunder pauses and ranks last at every speed within +-10% and every tick phase."""
    w = load_workload(name)
    profile = load_profile(w.profile)
    for factor in (0.9, 1.0, 1.1):
        engine = _slower(profile, factor)
        fifo = Simulation(w, make_policy("fifo"), engine).run().summary["output_tok_s"]
        for up in (0.5, 2.5, 4.5):  # how long the gateway had been up: the ticks' phase
            ours = Simulation(w, make_policy("rollyard"), engine, shell_up_s=up).run().summary
            thunder = Simulation(w, make_policy("thunder"), engine, shell_up_s=up).run().summary
            case = (factor, up, fifo, ours["output_tok_s"], thunder["output_tok_s"])
            assert thunder["pauses"] > 0, case
            assert thunder["output_tok_s"] < 0.98 * min(fifo, ours["output_tok_s"]), case


def test_rank_strict_compares_the_order_of_throughputs() -> None:
    def val(live: list[float], sim: list[float]) -> dict[str, dict[str, dict[str, float]]]:
        return {
            p: {"live": {"output_tok_s": a}, "sim": {"output_tok_s": b}}
            for p, a, b in zip("xyz", live, sim, strict=True)
        }

    assert rank_strict(val([1, 2, 3], [10, 20, 30]), list("xyz")) == 1
    assert rank_strict(val([1, 2, 3], [20, 10, 30]), list("xyz")) == 0


def rounds_val(rounds: dict[str, list[float]], sim: dict[str, float]) -> dict[str, dict[str, object]]:
    """Validation rows as ``validate`` writes them: live median, simulated, the live rounds."""
    return {
        p: {
            "live": {"output_tok_s": sorted(r)[len(r) // 2]},
            "sim": {"output_tok_s": sim[p]},
            "rounds": [{"live": {"output_tok_s": x}} for x in r],
        }
        for p, r in rounds.items()
    }


def test_rank_ok_orders_the_pairs_the_live_rounds_resolve() -> None:
    tight = {"x": [10.0, 10.1, 10.2], "y": [20.0, 20.1, 20.2], "z": [20.5, 20.6, 20.7]}
    # y and z are 0.5 apart with a 0.2 spread: resolved, and the simulator must agree
    assert rank_ok(rounds_val(tight, {"x": 1, "y": 2, "z": 3}), list("xyz")) == (1, 3)
    assert rank_ok(rounds_val(tight, {"x": 1, "y": 3, "z": 2}), list("xyz")) == (0, 3)


def test_rank_ok_asks_a_tie_for_a_tie() -> None:
    # z's 8.0 spread covers its 0.4 gap to y: a live tie, which the simulator must also call one
    noisy = {"x": [10.0, 10.1, 10.2], "y": [20.0, 20.1, 20.2], "z": [16.0, 20.5, 24.0]}
    assert rank_ok(rounds_val(noisy, {"x": 10, "y": 23, "z": 20}), list("xyz")) == (1, 2)
    assert rank_ok(rounds_val(noisy, {"x": 10, "y": 20, "z": 23}), list("xyz")) == (1, 2)
    # a gap of 9 where the live rounds cannot tell them apart by more than 8 is invented
    assert rank_ok(rounds_val(noisy, {"x": 10, "y": 29, "z": 20}), list("xyz")) == (0, 2)
    # the resolved pairs still count: x ranked above both is wrong whatever the tie does
    assert rank_ok(rounds_val(noisy, {"x": 30, "y": 20, "z": 21}), list("xyz")) == (0, 2)


def test_rank_ok_with_one_round_falls_back_to_the_strict_order() -> None:
    one = {"x": [10.0], "y": [20.0], "z": [20.5]}
    assert rank_ok(rounds_val(one, {"x": 1, "y": 2, "z": 3}), list("xyz")) == (1, 0)
    assert rank_ok(rounds_val(one, {"x": 1, "y": 3, "z": 2}), list("xyz")) == (0, 0)
