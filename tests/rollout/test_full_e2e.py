"""``configs/full.yaml`` end to end on real parts: two steps with every training-side mechanism
switched on; the run's metrics and journal show that each of them fired."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from tests.rollout.conftest import restore_engine

from rollyard.core import EventKind
from rollyard.core.tables import read_parquet
from rollyard.gateway.recorder import SqliteJournal
from rollyard.rollout.config import builtin_config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _weights(path: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for f in sorted(path.glob("*.safetensors")):
        out.update(load_file(f))
    assert out, f"no weights under {path}"
    return out


async def test_the_full_config_runs_every_mechanism(
    tmp_path: Path, tiny_model_dir: Path, vllm_url: str
) -> None:
    cfg = builtin_config(
        "full",
        {
            "model.path": str(tiny_model_dir),
            "model.create": False,
            "engine.urls": [vllm_url],
            "run.progress": False,
            "tasks.perturb.prob": 1.0,  # every program perturbed: the check below cannot be luck
            "publish.mode": "disk",  # each published version on disk, to compare (memory mode: same weights)
        },
    )
    run = RunDir(tmp_path / "run")
    try:
        last = await train(cfg, run)
    finally:
        await asyncio.to_thread(restore_engine, vllm_url, tiny_model_dir)
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2] and last["policy_version"] == 2
    total = {k: sum(r.get(k, 0) for r in rows) for k in rows[0] if k.startswith("count_")}
    assert total["count_tool_calls"] > 0  # gateway: typed tool calls
    assert total["count_perturbations"] == sum(len(r["groups"]) for r in rows) * cfg.run.group_size
    assert total["count_context_rewrites"] > 0  # CM fired (and the gateway cut a segment)
    # the opening's `ls /tests`, seen inside every program's sandbox by the access-time monitor
    assert total["count_test_access"] >= total["count_perturbations"]
    assert sum(r["count_masked_samples"] for r in rows) > 0  # long negative samples left out
    assert last["judge_calls"] >= 2 * cfg.run.groups_per_step * cfg.run.group_size  # judged, via the gateway
    assert last["judge_unreadable"] == 0  # every judge reply held a score (forced_score)
    assert all(r["train_ranks"] == 2 for r in rows)  # 2 FSDP2 ranks (full.yaml: world_size 2)
    # Forced tool calls were flagged and trained against the proximal policy (no ratio against
    # their grammar-constrained logprobs), so IPA no longer masks their chunks and the run learns.
    assert all(r["count_forced_tokens"] > 0 and r["train_forced_frac"] > 0 for r in rows)
    # Free turns after the required ones were sampled at top_p 0.9: their recorded logprobs are the
    # nucleus's renormalised ones, ~0.105 nats above the trainer's, and IPA's mask dropped them.
    assert any(r["train_forced_frac"] < 1 for r in rows)
    assert any(r["train_chunk_mask_frac"] > 0 and r["train_mismatch_mean"] > 0.05 for r in rows)
    assert all(r["train_grad_norm"] > 0 for r in rows)
    versions = [_weights(tiny_model_dir)] + [_weights(run.weights / f"v{v:06d}") for v in (1, 2)]
    for before, after in itertools.pairwise(versions):
        assert any(not torch.equal(before[k], after[k]) for k in before)  # every step changed them
    assert all(r["reward_process"] <= 0 for r in rows)
    trajs = read_parquet(run.trajectory_file(1)) + read_parquet(run.trajectory_file(2))
    kinds = {e.kind for t in trajs for e in t.events}
    assert {EventKind.TOOL_CALL, EventKind.TOOL_RESULT, EventKind.COMPLETION, EventKind.PERTURBATION} <= kinds
    policy_rewrites = [
        e.payload for t in trajs for e in t.events if e.kind == EventKind.CONTEXT_REWRITE and e.payload.policy
    ]
    assert policy_rewrites and all(p.policy == "discard_all" for p in policy_rewrites)
    touched = [e.payload for t in trajs for e in t.events if e.kind == EventKind.TEST_ACCESS]
    assert {(a.path, a.how, a.where) for a in touched} == {("/tests", "listed", "decoy")}
    assert all(any(e.kind == EventKind.TEST_ACCESS for e in t.events) for t in trajs)  # each program's
    journal = SqliteJournal(run.root / "journal.db")
    try:
        assert len(journal.program_ids("judge")) == last["judge_calls"]
    finally:
        journal.close()
