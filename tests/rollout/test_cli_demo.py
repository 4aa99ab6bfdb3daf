"""The CLI-learning demo (``rollyard demo --agent mini-swe-agent``, config
``demo-mini-swe-agent``) for one RL step on a handful of tasks: unmodified mini-SWE-agent runs
against the scripted engine (its warm start in its own turn format), then on SmolLM2 through the
gateway, and the trainer's weights move."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from safetensors.torch import load_file

from rollyard.core.sample import Sample
from rollyard.core.tables import read_parquet
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.rollout.entry import run_training
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.engine, pytest.mark.slow]

AGENT_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "rollyard"


def _max_change(a: Path, b: Path) -> float:
    wa, wb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    shared = wa.keys() & wb.keys()
    assert shared, "no tensor in common"
    return max(float((wa[k] - wb[k]).abs().max()) for k in shared)


@pytest.mark.timeout(900)
def test_the_cli_demo_warm_starts_mini_swe_agent_on_scripted_replies_and_trains_a_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollyard.agents.install import install

    monkeypatch.setenv("ROLLYARD_CACHE", os.environ.get("ROLLYARD_CACHE", str(AGENT_CACHE)))
    install("mini-swe-agent")
    overrides = {
        "tasks.train.n": 4,
        "tasks.eval": None,
        "sft.demos": 4,
        "sft.mistake_prob": 0.25,
        "sft.epochs": 1,
        "sft.batch": 4,
        "sft.train_layers": 2,  # one SFT step on ~4.4k tokens: ~50 s on 2 cores, not the demo's 12 layers
        "engine.kv_tokens": 8192,
        "engine.startup_timeout_s": 900,
        "trainer.train_layers": 2,
        # The warm-started model's group rewards may all be equal: zero advantages, no update.
        # Cross-entropy on the rollouts always moves the weights, which is what is checked here.
        "trainer.loss.kind": "sft",
        "run.steps": 1,
        "run.groups_per_step": 2,
        "run.group_size": 2,
        "run.progress": False,
        "publish.mode": "disk",
    }
    run = RunDir(tmp_path / "run")
    run_training(Path("demo-mini-swe-agent"), run.root, None, None, overrides)

    # The warm start: the CLI's programs against the script, recorded by the gateway.
    journal = SqliteJournal(run.root / "sft" / "journal.db")
    try:
        demos = [journal.trajectory(i) for i in journal.program_ids()]
    finally:
        journal.close()
    assert len(demos) == 4
    tok = FastTokenizer(run.root / "model")
    replies = [tok.decode(turn.completion_ids) for t in demos for turn in t.turns]
    # the script's tool calls, in the template's format, each ending the turn
    assert all(r.startswith("<tool_call>") and r.endswith("<|im_end|>") for r in replies), replies
    assert any("grep -r" in r for r in replies) and any(
        "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in r for r in replies
    )
    # mini-SWE-agent ran the script's commands in its sandbox: a program that read passed the
    # hidden test (the value came from grep's output in the CLI's prompt)
    readers = [t for t in demos if any("grep -r" in tok.decode(turn.completion_ids) for turn in t.turns)]
    assert readers and all(t.outcome is not None and t.outcome.passed for t in readers), [
        t.outcome for t in readers
    ]
    assert all(len(t.turns[0].prompt_ids) > 800 for t in demos)  # the CLI's own ~950-token prompt
    samples = [
        Sample.model_validate(json.loads(line))
        for line in (run.root / "sft" / "demos.jsonl").read_text().splitlines()
    ]
    assert len(samples) == 4 and all(sum(s.loss_mask) > 0 for s in samples)
    (sft_model,) = sorted((run.root / "sft").glob("v*"))
    assert _max_change(sft_model, run.root / "model") > 0  # the warm start trained

    # RL: the CLI's programs on the warm-started model, through the gateway; the step trained.
    trajs = read_parquet(run.trajectory_file(1))
    assert len(trajs) == 4 and all(t.num_turns >= 1 and t.outcome is not None for t in trajs)
    (row,) = [r for r in run.read_metrics() if r["step"] == 1]
    assert row["train_trained_tokens"] > 0
    assert _max_change(run.weights / "v000001", sft_model) > 0
