"""``rollyard train`` with ``engine.drafting.method: grouped_suffix``: the run starts its own
engine with the grouped drafter, trains, and its metrics say the drafter fired."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.rollout.orchestrator import train
from rollyard.rollout.report import make_report
from rollyard.rollout.rundir import RunDir

from .conftest import own_engine_config

pytestmark = [pytest.mark.engine, pytest.mark.slow]


async def test_a_run_with_the_grouped_drafter_trains_and_records_acceptance(
    tmp_path: Path, tiny_model_dir: Path
) -> None:
    cfg = own_engine_config(
        tiny_model_dir,
        **{
            "run.steps": 1,
            # Greedy, the random tiny model repeats itself, so the drafter has something to draft.
            "run.temperature": 0.0,
            "agent.max_tokens": 64,
            "engine.startup_timeout_s": 600,
            "engine.drafting": {"method": "grouped_suffix", "k": 4},
        },
    )
    run = RunDir(tmp_path / "run")
    await train(cfg, run)
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["spec_drafts"] > 0
    assert rows[0]["spec_acceptance_len"] >= 1.0
    assert "spec_acceptance_len_mean" in make_report(run.root).read_text()
