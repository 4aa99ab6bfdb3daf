"""``rollyard train`` with two FSDP2 ranks for two steps, then resumed from its sharded checkpoint
with one rank: the weights moved, and the resumed run carries on from the saved step."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollyard.rollout.config import Config, dump_config
from rollyard.rollout.entry import run_training
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _max_change(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def test_two_fsdp_ranks_train_then_one_rank_resumes(
    tmp_path: Path, tiny_model_dir: Path, make_config: Callable[..., Config]
) -> None:
    cfg = make_config(
        **{
            "trainer.world_size": 2,
            "trainer.parallel.kind": "fsdp2",
            "run.steps": 2,
            "run.checkpoint_every": 2,
            "run.groups_per_step": 2,
            # A random model's group rewards are usually all equal: zero advantages, no update.
            # Cross-entropy on the rollouts always moves the weights, which is what is checked here.
            "trainer.loss.kind": "sft",
            # the published versions are read back from disk below (memory mode writes none)
            "publish.mode": "disk",
        }
    )
    path = tmp_path / "run.yaml"
    path.write_text(dump_config(cfg))
    run = RunDir(tmp_path / "run")
    run_training(path, run.root, None, None, {})
    rows = run.read_metrics()
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2]
    assert all(r["train_ranks"] == 2 for r in rows if r["step"] > 0)
    assert (run.checkpoint / "dcp" / ".metadata").is_file()  # sharded (DCP), not one file
    assert _max_change(run.weights / "v000002", tiny_model_dir) > 0  # published weights learned

    run_training(None, None, run.root, None, {"trainer.world_size": 1, "run.steps": 3})
    rows = run.read_metrics()
    assert [r["step"] for r in rows if r["step"] > 0] == [1, 2, 3]
    resumed = rows[-1]
    assert resumed["policy_version"] == 3 and "train_ranks" not in resumed  # one plain trainer
    assert _max_change(run.weights / "v000003", run.weights / "v000002") > 0
    ledger = torch.load(run.checkpoint / "state.pt", weights_only=False)["extra_state"]
    assert ledger["step"] == 3 and ledger["version"] == 3
