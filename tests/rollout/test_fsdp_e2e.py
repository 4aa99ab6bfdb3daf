"""``rollyard train demo-smollm2`` end to end on two FSDP2 ranks, then resumed on one.

The run makes its model dir from the cached conversion of the pretrained SmolLM2-135M, starts its
own vLLM on it, rolls out ``readout`` programs and trains two steps on two gloo FSDP2 ranks; the
resumed run loads the sharded (DCP) checkpoint into one plain trainer and carries on to step 3.
The published weights move at both stages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollyard.core.tables import read_parquet
from rollyard.rollout.entry import run_training
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _max_change(a: Path, b: Path) -> float:
    """The largest element change between two model dirs' weights (over the tensors both hold)."""
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    shared = wa.keys() & wb.keys()
    assert shared, "no tensor in common"
    return max(float((wa[k] - wb[k]).abs().max()) for k in shared)


# Two runs, each starting its own SmolLM2 engine (~1 min quiet, ~3 min at load 15 on 2 cores).
@pytest.mark.timeout(1500)
def test_a_pretrained_smollm2_run_trains_on_two_fsdp_ranks_then_resumes_on_one(tmp_path: Path) -> None:
    overrides = {
        "trainer.world_size": 2,
        "trainer.parallel.kind": "fsdp2",
        "trainer.train_layers": 2,
        "trainer.token_budget": 1024,
        # The untrained model's group rewards are usually all equal: zero advantages, no update.
        # Cross-entropy on the rollouts always moves the weights, which is what is checked here.
        "trainer.loss.kind": "sft",
        "sft.enabled": False,
        "tasks.train.n": 4,
        "tasks.eval": None,
        "agent.max_turns": 1,
        "agent.max_tokens": 16,
        "engine.kv_tokens": 4096,
        "engine.startup_timeout_s": 900,
        "run.steps": 2,
        "run.checkpoint_every": 2,
        "run.groups_per_step": 2,
        "run.group_size": 2,
        "run.progress": False,
        # the published versions are read back from disk below (memory mode writes none)
        "publish.mode": "disk",
    }
    run = RunDir(tmp_path / "run")
    run_training(Path("demo-smollm2"), run.root, None, None, overrides)  # `rollyard train demo-smollm2`
    assert json.loads((run.root / "model" / "rollyard.json").read_text())["from"] == "smollm2-135m"
    trajs = read_parquet(run.trajectory_file(1))
    assert len(trajs) == 4 and all(t.num_turns >= 1 and t.outcome is not None for t in trajs)
    rows = [r for r in run.read_metrics() if r["step"] > 0]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["train_ranks"] == 2 and r["train_trained_tokens"] > 0 for r in rows)
    assert all(0 < r["train_trainable_params"] < 10_000_000 for r in rows)  # 2 of 30 layers + the norm
    assert (run.checkpoint / "dcp" / ".metadata").is_file()  # sharded (DCP), not one file
    assert _max_change(run.weights / "v000002", run.root / "model") > 0  # published weights learned

    run_training(None, None, run.root, None, {"trainer.world_size": 1, "run.steps": 3})
    rows = run.read_metrics()
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2, 3]
    resumed = rows[-1]
    assert resumed["policy_version"] == 3 and "train_ranks" not in resumed  # one plain trainer
    assert resumed["train_trained_tokens"] > 0
    assert _max_change(run.weights / "v000003", run.weights / "v000002") > 0
    ledger = torch.load(run.checkpoint / "state.pt", weights_only=False)["extra_state"]
    assert ledger["step"] == 3 and ledger["version"] == 3
