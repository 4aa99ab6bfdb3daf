"""``rollyard bench offpolicy``: its configs, its CLI sizes, and its smallest version end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollyard.bench.offpolicy import CONFIGS, DEMO, LR, STALENESS, run_overrides
from rollyard.cli import _register, app
from rollyard.core.errors import ConfigError
from rollyard.rl.corrections import WEIGHT_KINDS, CorrectionKind
from rollyard.rollout.config import builtin_config


def test_every_correction_the_trainer_offers_is_a_config_and_each_config_is_valid() -> None:
    assert set(CONFIGS) == {"onpolicy"} | {k.value for k in CorrectionKind}
    for name in CONFIGS:
        cfg = builtin_config(DEMO, run_overrides(name, Path("/m"), "http://127.0.0.1:1", 3, 1, quick=False))
        assert (cfg.trainer.lr, cfg.buffer.max_staleness, cfg.run.steps, cfg.run.seed) == (
            LR,
            STALENESS,
            3,
            1,
        )
        assert cfg.run.mode == ("sync" if name == "onpolicy" else "async")
        kind = CorrectionKind.NONE if name == "onpolicy" else CorrectionKind(name)
        assert cfg.trainer.correction.kind == kind
        assert cfg.trainer.decoupled == (kind in WEIGHT_KINDS)  # the weight kinds need it
        assert not cfg.sft.enabled and cfg.engine.urls == ["http://127.0.0.1:1"]


def test_steps_and_seeds_are_refused_by_benches_that_do_not_take_them() -> None:
    _register()
    res = CliRunner().invoke(app, ["bench", "sandbox", "--steps", "2"])
    assert isinstance(
        res.exception, ConfigError
    ) and "--steps applies to drafting, drafting-eagle, offpolicy only" in str(res.exception)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.longbench  # 21 min measured: make test-bench, not the CI suite
@pytest.mark.timeout(3600)  # 7 runs of SmolLM2 (and its SFT warm start when not cached yet)
def test_the_smallest_offpolicy_bench_runs_every_config_end_to_end(tmp_path: Path) -> None:
    """One seed, two steps (the second can train on stale samples), every config on real vLLM."""
    env = {**os.environ, "ROLLYARD_BENCH_DIR": str(tmp_path)}
    cmd = [
        sys.executable,
        "-m",
        "rollyard",
        "bench",
        "offpolicy",
        "--quick",
        "--steps",
        "2",
        "--seeds",
        "1",
    ]
    with (tmp_path / "stdout").open("w") as so, (tmp_path / "stderr").open("w") as se:
        rc = subprocess.run(cmd, env=env, stdout=so, stderr=se, timeout=3500, check=False).returncode
    assert rc == 0, (tmp_path / "stderr").read_text()[-3000:]
    last = (tmp_path / "stdout").read_text().strip().splitlines()[-1]
    assert last.startswith("offpolicy: onpolicy=") and "worst_kl_icepop=" in last
    doc = json.loads((tmp_path / "offpolicy.json").read_text())
    summary, runs = doc["summary"], doc["details"]["runs"]
    for name in CONFIGS:
        assert 0.0 <= summary[name] <= 1.0 and summary[f"worst_kl_{name}"] >= 0.0
        (run,) = runs[name]
        assert run["steps"] == 2 and run["max_grad_norm"] > 0  # every run trained
    assert runs["onpolicy"][0]["mean_staleness"] == 0  # sync: sampled by the policy trained
    stale = [n for n in CONFIGS if runs[n][0]["mean_staleness"] > 0]
    assert stale  # asynchronous runs trained on samples of older versions
    # and those were further from the trainer than the on-policy run's (engine/trainer numerics only)
    assert all(summary[f"worst_kl_{n}"] > summary["worst_kl_onpolicy"] for n in stale)
