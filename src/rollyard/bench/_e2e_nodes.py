"""``rollyard bench e2e --ray-nodes 2``: the e2e workload on one node and on two, side by side.

One node: ``rollyard train`` with its own local engine and in-process agents. Two nodes: the
same config on the two namespaced Ray nodes of ``rollout.netns`` (head: gateway + trainer;
worker: the engine as a Ray actor, agents and sandboxes on Ray workers), every byte between
them over the veth pair. Both are child processes started the same way; only the training
loop's wall time (``wall_s`` of each step) counts, not the engine start-up. On one host both
nodes share the same cores, so the ratio shows Ray's and the network path's overhead, not a
second machine's capacity.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from rollyard.bench._model import bench_model, result_name
from rollyard.bench._report import loadavg, report
from rollyard.bench.e2e import workload as e2e_workload
from rollyard.core.errors import ConfigError
from rollyard.rollout.config import builtin_config
from rollyard.rollout.netns import HEAD_IP, TwoNodeRay
from rollyard.rollout.rundir import RunDir

RUN_S = 1200.0


def workload(model: Path, steps: int) -> dict[str, Any]:
    """The e2e bench's workload (``bench/e2e.py``) with its own local engine."""
    return builtin_config("quick", e2e_workload(model, steps)).model_dump(mode="json")


TWO_NODES = {  # what a run on the namespaced cluster changes (tests/rollout/test_two_nodes.py too)
    "gateway": {"host": "0.0.0.0", "advertise": HEAD_IP},
    "publish": {"host": HEAD_IP},
    "ray": {"workers": 2},
}


def _train(argv: list[str], run: RunDir, cluster: TwoNodeRay | None) -> float:
    """One ``rollyard train`` to its end; its wall time, start-up included."""
    rollyard = str(Path(sys.executable).parent / "rollyard")
    err = open(run.root.parent / f"{run.root.name}.stderr", "wb")  # noqa: SIM115 - the child writes it
    t0 = time.monotonic()
    with err:
        if cluster is None:
            proc = subprocess.Popen([rollyard, "train", *argv], stdout=subprocess.DEVNULL, stderr=err)
        else:
            env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
            proc = cluster.popen(
                "head", [rollyard, "train", *argv], stdout=subprocess.DEVNULL, stderr=err, env=env
            )
        try:
            rc = proc.wait(timeout=RUN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            rc = -1
    if rc != 0:
        tail = (run.root.parent / f"{run.root.name}.stderr").read_text(errors="replace")[-2000:]
        raise ConfigError(f"bench run {run.root.name} failed (rc={rc}):\n{tail}")
    return time.monotonic() - t0


def _summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Agent steps (model turns) per minute of training loop, as ``bench e2e`` counts them."""
    loop_s = sum(r["wall_s"] for r in rows)
    turns = sum(r["turns_per_episode"] * 8 for r in rows)  # 2 groups x G=4 episodes per step
    step_s = statistics.median(r["wall_s"] for r in rows)
    return {"steps_per_min": 60.0 * turns / max(loop_s, 1e-9), "loop_s": loop_s, "step_s_median": step_s}


def main(quick: bool, model: str) -> dict[str, Any]:
    steps = 2 if quick else 4
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-nodes-") as tmp:
        root = Path(tmp)
        doc = workload(bench_model(model, root), steps)
        one_cfg = root / "one.yaml"
        one_cfg.write_text(yaml.safe_dump(doc))
        two = {**doc, **{k: {**doc.get(k, {}), **v} for k, v in TWO_NODES.items()}}
        two_cfg = root / "two.yaml"
        two_cfg.write_text(yaml.safe_dump(two))
        one, both = RunDir(root / "one"), RunDir(root / "two")
        one_wall = _train([str(one_cfg), "--run-dir", str(one.root)], one, None)
        with TwoNodeRay(worker_cpus=2) as cluster:
            two_wall = _train(
                [str(two_cfg), "--run-dir", str(both.root), "--ray", cluster.address], both, cluster
            )
        a, b = _summary(one.read_metrics()), _summary(both.read_metrics())
    summary = {
        "steps_per_min_1node": a["steps_per_min"],
        "steps_per_min_2nodes": b["steps_per_min"],
        "ratio": b["steps_per_min"] / max(a["steps_per_min"], 1e-9),
    }
    details = {
        "model": model,
        "train_steps": steps,
        "loop_s": {"one_node": a["loop_s"], "two_nodes": b["loop_s"]},
        "step_s_median": {"one_node": a["step_s_median"], "two_nodes": b["step_s_median"]},
        "wall_s_including_setup": {"one_node": one_wall, "two_nodes": two_wall},
        "load": loadavg(),
    }
    return report(result_name("e2e-ray-nodes2", model), summary, details)
