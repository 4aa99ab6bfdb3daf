"""``rollyard train`` with prefill/decode roles: the quick config on two engines it starts itself,
``engine.kv_pool: {kind: local}`` and ``engine.role: [prefill, decode]``. The run's step row and
trajectories say that every program's first prompt was prefilled on the prefill engine, that
every turn ran on the decode engine, which loaded prompt blocks from the pool, and the step
changed the weights."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tests.rollout.test_full_e2e import _weights

from rollyard.core.tables import read_parquet
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

from .conftest import own_engine_config

pytestmark = [pytest.mark.engine, pytest.mark.slow]
BLOCK = 64  # the launcher's KV block size on CPU


async def test_a_run_prefills_first_prompts_on_the_prefill_engine_and_decodes_on_the_other(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cfg = own_engine_config(
        tiny_model_dir,
        **{
            "run.steps": 1,
            "engine.count": 2,
            "engine.kv_tokens": 4096,
            "engine.startup_timeout_s": 600,
            "engine.kv_pool": {"kind": "local", "root": str(tmp_path / "pool")},
            "engine.role": ["prefill", "decode"],
            "gateway.pd_min_prompt_tokens": BLOCK,  # the quick task's first prompts are short
            "publish.mode": "disk",  # the published version on disk, to compare
            "trainer.loss.kind": "sft",  # moves the weights whatever the (often equal) rewards
        },
    )
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    (row,) = run.read_metrics()
    trajs = read_parquet(run.trajectory_file(1))
    assert trajs and last["policy_version"] == 1
    first = [len(t.turns[0].prompt_ids) for t in trajs]
    assert min(first) > BLOCK, first  # each has a full block for the decode engine to load
    # every program's first prompt went through the prefill engine (programs started beyond the
    # step's trajectories count too), and no prefill failed
    assert row["sched_pd_prefills"] >= len(trajs) and row["sched_pd_prefill_failures"] == 0
    assert {turn.engine for t in trajs for turn in t.turns} == {"engine1"}  # the decode engine
    pre, dec = row["prompt_tokens_by_engine"]["engine0"], row["prompt_tokens_by_engine"]["engine1"]
    assert pre["computed"] > 0
    # the decode engine's first program found nothing in its own cache: every full block of its
    # first prompt (all but its last token may load) came from the pool, as the prefill engine
    # stored it
    assert dec["loaded"] >= (min(first) - 1) // BLOCK * BLOCK and dec["loaded"] % BLOCK == 0, (dec, first)
    assert row["prompt_tokens_loaded"] == pre.get("loaded", 0) + dec["loaded"]
    assert row["train_grad_norm"] > 0
    before, after = _weights(tiny_model_dir), _weights(run.weights / "v000001")
    assert any(not torch.equal(before[k], after[k]) for k in before)
