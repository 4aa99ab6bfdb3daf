"""Claude Code (npm, Anthropic messages) as every program of one `rollyard train` step.

Its ~31.6k-token system prompt and two dozen tool schemas need an engine with a long context,
started by the run itself (the session's engine holds 2,048 tokens), and several minutes of
prefill on two CPU cores, so this test runs under `make test-agents` (which sets
``ROLLYARD_TEST_AGENTS=1``), not in `make test` / CI; mini-SWE-agent and Codex train in CI
(tests/rollout/test_train_e2e.py).

Passes in ~2 min on a quiet 2-core machine (2026-12-03); at load ~28 (2026-12-01) the run's
engine died during the first prefills (vLLM: "RPC call to execute_model timed out") after 18
minutes with no turn recorded: it needs the cores to itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollyard.core.tables import read_parquet
from rollyard.rollout.config import builtin_config
from rollyard.rollout.orchestrator import train
from rollyard.rollout.rundir import RunDir

pytestmark = [
    pytest.mark.engine,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("ROLLYARD_TEST_AGENTS") != "1", reason="Claude Code trains under `make test-agents`"
    ),
]

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "rollyard"


@pytest.mark.timeout(2400)
async def test_claude_code_trains_unmodified_for_one_step(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollyard.agents.install import install

    monkeypatch.setenv("ROLLYARD_CACHE", os.environ.get("ROLLYARD_CACHE", str(CACHE)))
    # one engine step holding two ~31k-token prefills can outlast vLLM's 300 s on loaded cores
    monkeypatch.setenv("VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS", "3600")
    install("claude-code")
    cfg = builtin_config(
        "quick",
        {
            "model.path": str(tiny_model_dir),
            "model.create": False,
            "run.progress": False,
            "engine.urls": [],  # the run starts its own engine, long enough for the prompt
            "engine.max_model_len": 40960,
            "engine.kv_tokens": 81920,
            "engine.startup_timeout_s": 900,
            "agent.kind": "blackbox",
            "agent.profile": "claude-code",
            "agent.timeout_s": 1500,
            "run.steps": 1,
            "run.groups_per_step": 1,
            "run.max_groups_in_flight": 1,  # two CLIs at a time: each prefill is ~31k tokens
        },
    )
    run = RunDir(tmp_path / "run")
    last = await train(cfg, run)
    assert last["policy_version"] == 1  # a step trained and its weights were published
    trajs = read_parquet(run.trajectory_file(1))
    assert len(trajs) == cfg.run.group_size
    for t in trajs:
        assert t.num_turns >= 1 and t.outcome is not None, t.status
        first = t.segments[0].turns[0]
        # Claude Code's own system prompt and tools open the program's first turn, token-exact
        # (its first calls carry ~19.2k tokens of them, later ones ~31.4k: docs/agents.md)
        assert len(first.prompt_ids) > 15_000 and len(first.completion_ids) == len(first.completion_logprobs)
        assert t.outcome.details.get("agent_status") in ("exited", "agent_error"), t.outcome.details
