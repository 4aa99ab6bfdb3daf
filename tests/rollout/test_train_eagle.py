"""``rollyard train`` with ``engine.drafting.method: eagle, online: true``: the run makes a head
for its policy, the engine drafts with it through vLLM's eagle method, the trainer steps the
head every RL step, and each published version (disk or memory publish) carries the head the
engine then loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.engines.drafting.eagle_files import HEAD_DIR, HEAD_FILE
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

from .conftest import own_engine_config

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["disk", "memory"])
async def test_a_run_trains_the_eagle_head_online_and_the_engine_loads_each_version(
    mode: str, tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path / "cache"))  # head: auto is made here
    cfg = own_engine_config(
        tiny_model_dir,
        **{
            "run.steps": 2,
            "run.temperature": 0.0,
            "agent.max_tokens": 64,
            "engine.startup_timeout_s": 600,
            "publish.mode": mode,  # disk: draft_head/ beside the weights; memory: sent with them
            "engine.drafting": {"method": "eagle", "k": 3, "online": True, "warm_steps": 0, "rows": 2},
        },
    )
    run = RunDir(tmp_path / "run")
    await train(cfg, run)
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["draft_head_loss"] > 0  # the head's Top-K KL was computed on the step's trajectories
        assert r["draft_head_delta"] > 0  # and its weights changed
        assert r["draft_head_s"] > 0  # timed on its own, outside train_s
        assert r["publish_engine_draft_head_load_s"] > 0  # the engine loaded that version's head
        # it drafted with it: k = 3 tokens a draft, each position's acceptance counted
        assert r["spec_drafts"] > 0 and r["spec_draft_tokens"] >= r["spec_drafts"]
        assert 0 <= r["spec_accepted_tokens"] <= r["spec_draft_tokens"]
        assert len(r["spec_accepted_per_pos"]) == 3
    assert [r["draft_head_steps"] for r in rows] == [1, 2]
    if mode == "disk":
        assert (run.weights / "v000002" / HEAD_DIR / HEAD_FILE).is_file()
    assert any((tmp_path / "cache" / "models" / "eagle-heads").glob(f"*/{HEAD_FILE}"))


async def test_a_resumed_run_continues_the_online_head_from_its_checkpoint(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path / "cache"))
    cfg = own_engine_config(
        tiny_model_dir,
        **{
            "run.steps": 1,
            "run.checkpoint_every": 1,
            "run.temperature": 0.0,
            "agent.max_tokens": 64,
            "engine.startup_timeout_s": 600,
            "publish.mode": "disk",
            "engine.drafting": {"method": "eagle", "k": 3, "online": True, "warm_steps": 0, "rows": 2},
        },
    )
    run = RunDir(tmp_path / "run")
    await train(cfg, run)  # stops after step 1 and its checkpoint
    resumed = run.load_config({"run.steps": 2})
    await train(resumed, run, resume=True)
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1, 2]
    # the head's second step: trained on from the checkpoint's head, not from the starting one
    assert [r["draft_head_steps"] for r in rows] == [1, 2]
    assert rows[1]["draft_head_delta"] > 0 and rows[1]["spec_drafts"] > 0
    # the resumed engine started on version 1's weights with the head trained with them
    assert resumed.engine.drafting.head == str(run.weights / "v000001" / HEAD_DIR)
    assert (run.weights / "v000002" / HEAD_DIR / HEAD_FILE).is_file()
