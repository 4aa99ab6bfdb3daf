"""``rollyard train quick --ray local --set trainer.world_size=2``: trainer rank 1 runs as a Ray
actor in the run's placement group (``trainer.placement: auto``), meets rank 0 at the node's
routable address, and the two ranks' steps reach the engine as new weights."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rollyard.rollout.config import Config
from rollyard.rollout.entry import run_training
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_rollyard_train_with_ray_runs_trainer_rank_1_as_a_placement_group_actor(
    tmp_path: Path, tiny_model_dir: Path, vllm_url: str, make_config: Callable[..., Config]
) -> None:
    pytest.importorskip("ray")
    del make_config  # requested for its teardown: the session engine gets its weights back
    overrides = {
        "model.path": str(tiny_model_dir),
        "model.create": False,
        "engine.urls": [vllm_url],
        "trainer.world_size": 2,  # placement auto + --ray: rank 1 on Ray
        "trainer.loss.kind": "sft",  # moves the weights whatever the (often equal) rewards
        "ray.workers": 1,
        "run.steps": 2,
        "run.progress": False,
        "publish.mode": "disk",  # the published versions are read back below
    }
    run = RunDir(tmp_path / "run")
    run_training(Path("quick"), run.root, None, "local", overrides)  # `rollyard train quick --ray local`
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2] and rows[-1]["policy_version"] == 2
    assert all(r["train_ranks"] == 2 and r["train_ranks_on_ray"] == 1.0 for r in rows)
    assert all(r["train_trained_tokens"] > 0 and r["train_grad_norm"] > 0 for r in rows)
    log = (run.logs / "run.log").read_text()
    up = re.search(r"trainer ranks up world=2 .*placement=ray rendezvous=([\d.]+):\d+", log)
    assert up and not up.group(1).startswith("127."), log[-2000:]
    assert f"trainer rank actors joined nodes=['{up.group(1)}']" in log  # one node: the head's
    before = load_file(str(tiny_model_dir / "model.safetensors"))
    after = load_file(str(run.weights / "v000002" / "model.safetensors"))
    assert max(float((after[k] - before[k]).abs().max()) for k in before.keys() & after.keys()) > 0
