"""``rollyard bench sim``'s gateway-bound validation: is the simulated gateway queue right where the
gateway is the bottleneck?

The canned engine (answers at once) behind a real ``rollyard gateway`` pinned to one core
(``taskset``). The gateway is calibrated there right before each level (``rollyard sim calibrate
--gateway``'s waves, same process, same core), the engine hop is timed directly (the median of
sequential requests to the canned engine: ``request_s``). Then at three load levels (closed loops of
``LEVELS`` programs, each playing agent turns whose history grows, no tool sleep) the programs run
live (``_sim_live.run_live``, as the engine validation does) and each trace is replayed in the
simulator: an engine that costs nothing but its hop, in front of the calibrated gateway of one shard
of one core. Reported: each level's live and simulated throughput and their error, and the share of
its core the live gateway got (``live_gateway_cores``: the model gives the gateway its core whole, a
shared machine does not); ``err_thr_gateway_bound`` is the worst level's.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import httpx

from rollyard.bench._gateway_calibrate import _measure, gateway_cost
from rollyard.bench._procs import _canned, _cpu_seconds, _gateway, pin, pinned_here
from rollyard.bench._sim_live import run_live
from rollyard.sched import make_policy
from rollyard.sim import Simulation
from rollyard.sim.profile import EngineProfile
from rollyard.sim.workload import Workload

__all__ = ["LEVELS", "gateway_bound"]

LEVELS = (32, 64, 128)  # programs in flight
MAX_LEN = 65536


def _workload(programs: int, turns: int) -> Workload:
    return Workload.model_validate(
        {
            "name": f"gateway-bound-{programs}", "programs": programs, "engines": 1, "seed": programs,
            "turns": {"value": turns}, "prompt_tokens": {"value": 300}, "output_tokens": {"value": 32},
            "tool_tokens": {"value": 600}, "tool_s": {"value": 0.0}, "max_context": MAX_LEN,
        }
    )  # fmt: skip


async def _hop(engine_url: str, n: int = 30) -> float:
    """The canned engine's answer time, one request at a time: the gateway's engine call."""
    body = {"model": "tiny", "prompt": list(range(100, 2100)), "max_tokens": 32, "temperature": 1.0,
            "logprobs": 0, "return_tokens_as_token_ids": True}  # fmt: skip
    times = []
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            (await client.post(f"{engine_url}/v1/completions", json=body)).raise_for_status()
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _calibrate(url: str, pid: int, core: str, turns: int) -> tuple[Any, str]:
    """The pinned gateway's cost model from ``rollyard sim calibrate --gateway``'s waves, now."""
    points = asyncio.run(
        _measure(url, pid, concurrency=32, turns=turns, tool_words=250, outputs=(32, 256), repeats=1)
    )
    return gateway_cost(points, f"pinned to core {core}, bench sim")


def gateway_bound(turns: int = 8, core: str = "0") -> dict[str, Any]:
    """Each level: calibrate the pinned gateway, then run the level live and simulated.

    Calibrated again right before each level (seconds, on the same gateway): one calibration ahead
    of all three left the later levels with a cost measured minutes earlier, and the gateway's CPU
    per request drifted between phases on this shared VM (errors of either sign, 0.10-0.30)."""
    out: dict[str, Any] = {"core": core, "levels": {}, "load1_before": os.getloadavg()[0]}
    # everything else (this client, the canned engine) on the other cores, so the gateway's
    # core is its own, as the model has it
    rest = sorted(os.sched_getaffinity(0) - {int(core)}) or [int(core)]
    out["client_cores"] = ",".join(map(str, rest))
    canned = _canned(max_model_len=MAX_LEN, token_interval_ms=1.0, cores=out["client_cores"])
    with (
        pinned_here(set(rest)),
        canned as (engine_url, model_dir),
        _gateway(engine_url, model_dir, ["--policy", "fifo"]) as (url, pid),
    ):
        pin(pid, core)
        hop = asyncio.run(_hop(engine_url))
        out["request_s"] = hop
        for c in LEVELS:
            cost, comment = _calibrate(url, pid, core, turns)
            out.setdefault("gateway", cost.model_dump(mode="json"))  # the first level's, as before
            out.setdefault("fit", comment)
            profile = EngineProfile(
                name="canned", source="the canned engine: no compute, its HTTP hop only", overhead_s=1e-6,
                per_token_s=0.0, request_s=hop, block_size=16, num_blocks=MAX_LEN * 64 // 16,
                max_num_seqs=1024, max_batched_tokens=1 << 20, max_model_len=MAX_LEN, gateway=cost,
            )  # fmt: skip
            w = _workload(c, turns)
            cpu0 = _cpu_seconds(pid)
            live = run_live(url, engine_url, w.plans())
            cpu = _cpu_seconds(pid) - cpu0
            sim = Simulation(w, make_policy("fifo"), profile, plans=live.plans).run().summary
            lv = live.summary()
            requests = sum(len(p.turns) for p in live.plans)
            out["levels"][c] = {
                "live_tok_s": lv["output_tok_s"],
                "sim_tok_s": sim["output_tok_s"],
                "err_thr": abs(sim["output_tok_s"] - lv["output_tok_s"]) / lv["output_tok_s"],
                "live_req_p50_s": lv["req_p50_s"],
                "sim_req_p50_s": sim["req_p50_s"],
                "sim_gateway_util": sim["gateway_util"],
                # the live gateway's share of its core: well under 1 while the simulated gateway,
                # which owns its core, is the bottleneck, means other processes took the core
                "live_gateway_cores": cpu / live.makespan_s,
                # where an error comes from: the gateway's CPU per request live, and the model's
                "live_cpu_ms_per_req": 1000 * cpu / requests,
                "sim_cpu_ms_per_req": 1000 * sim["gateway_util"] * sim["makespan_s"] / requests,
                "gateway": cost.model_dump(mode="json"),
                "load1": os.getloadavg()[0],
            }
    out["err_thr_gateway_bound"] = max(v["err_thr"] for v in out["levels"].values())
    return out
