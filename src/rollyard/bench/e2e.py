"""End-to-end baseline: a fixed short training run on real parts, and its throughput.

Workload: the tiny model (seed 0, random weights; or ``--model smollm2-135m``), `lookup` tasks,
G=4, 2 groups per step, 4 steps (2 with --quick), bwrap sandboxes, one local vLLM. Reported:
agent steps (model turns) per minute, completion tokens per second, the trainer's idle fraction
(waiting for groups), and the engine's KV-cache usage sampled every 0.5 s. This is the number
the scheduling work must beat. ``--ray-nodes 2`` runs it on one node and on two namespaced Ray
nodes instead (``_e2e_nodes``).

The run goes twice on the same engine: publishing in memory (the default, reported above) and
then by disk (safetensors written and reloaded, the earlier default); the last line adds each
one's median ``publish_s`` per step and the step time memory saves (their difference; negative:
it costs).
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rollyard.bench._model import TINY, bench_model, result_name
from rollyard.bench._report import report
from rollyard.engines.launcher import VLLMServer
from rollyard.engines.vllm import VLLMBackend
from rollyard.rollout.config import builtin_config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir
from rollyard.rollout.services import LOGPROBS_OF_SAMPLED

KV_TOKENS = 16384


def workload(model: Path, steps: int) -> dict[str, Any]:
    """The bench's workload as overrides of the ``quick`` config (the two-node bench runs it too)."""
    return {
        "model.path": str(model),
        "model.create": False,
        "tasks.train.n": 8,
        "run.steps": steps,
        "run.group_size": 4,
        "run.groups_per_step": 2,
        "run.max_groups_in_flight": 4,
        "run.progress": False,
        "agent.max_turns": 4,
        "agent.max_tokens": 32,
    }


async def _sample_kv(url: str, out: list[float], stop: asyncio.Event) -> None:
    backend = VLLMBackend(url)
    try:
        while not stop.is_set():
            with contextlib.suppress(Exception):  # a sample lost during a weight reload is no result
                out.append((await backend.stats()).kv_usage)
            await asyncio.sleep(0.5)
    finally:
        await backend.aclose()


async def _run(
    root: Path, url: str, model: Path, steps: int, publish: str = "memory"
) -> tuple[list[dict[str, Any]], list[float], float]:
    cfg = builtin_config("quick", {**workload(model, steps), "engine.urls": [url], "publish.mode": publish})
    kv: list[float] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(_sample_kv(url, kv, stop))
    t0 = time.monotonic()
    try:
        await train(cfg, RunDir(root / f"run-{publish}"))
    finally:
        stop.set()
        await sampler
    wall = time.monotonic() - t0
    return RunDir(root / f"run-{publish}").read_metrics(), kv, wall


def main(quick: bool = False, model: str = TINY, ray_nodes: int = 1) -> dict[str, Any]:
    if ray_nodes == 2:  # one node and two namespaced Ray nodes, side by side (``_e2e_nodes``)
        from rollyard.bench._e2e_nodes import main as on_two_nodes

        return on_two_nodes(quick, model)
    steps = 2 if quick else 4
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-e2e-") as tmp:
        root = Path(tmp)
        model_dir = bench_model(model, root)
        with VLLMServer(
            model_dir,
            kv_tokens=KV_TOKENS,
            served_name="policy",
            log_path=root / "vllm.log",
            extra_args=list(LOGPROBS_OF_SAMPLED),  # what an attached engine must record
        ) as server:
            rows, kv, wall = asyncio.run(_run(root, server.url, model_dir, steps))
            disk_rows, _, _ = asyncio.run(_run(root, server.url, model_dir, steps, publish="disk"))
    loop_s = sum(r["wall_s"] for r in rows)
    turns = sum(r["turns_per_episode"] * 8 for r in rows)  # 2 groups x G=4 episodes per step
    tokens = sum(r["completion_tokens"] for r in rows)
    idle = sum(r["trainer_idle_fraction"] * r["wall_s"] for r in rows) / max(loop_s, 1e-9)
    summary = {
        "steps_per_min": 60.0 * turns / max(loop_s, 1e-9),
        "tok_s": tokens / max(loop_s, 1e-9),
        "trainer_idle": idle,
        "publish_s_memory": statistics.median(r["publish_s"] for r in rows),
        "publish_s_disk": statistics.median(r["publish_s"] for r in disk_rows),
    }
    # The step time memory saves is the publish it shortens: the rest of a step (rollout, training)
    # is the same work in both runs, and its wall time varies far more than the publish between them
    # (sampled turns differ), so a difference of step medians would mostly measure that noise.
    summary["step_s_saved"] = summary["publish_s_disk"] - summary["publish_s_memory"]
    details = {
        "model": model,
        "train_steps": len(rows),
        "loop_s": loop_s,
        "wall_s_including_setup": wall,
        "kv_usage_mean": statistics.fmean(kv) if kv else None,
        "kv_usage_max": max(kv) if kv else None,
        "kv_capacity_tokens": KV_TOKENS,
        "rows": rows,
        "disk_rows": disk_rows,
        "step_s_median_memory": statistics.median(r["wall_s"] for r in rows),
        "step_s_median_disk": statistics.median(r["wall_s"] for r in disk_rows),
    }
    return report(result_name("e2e", model), summary, details)
