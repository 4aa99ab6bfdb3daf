"""``rollyard bench offpolicy``: its configs, its CLI sizes, and its smallest version end to end."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import rollyard.bench._report
from rollyard.bench import offpolicy
from rollyard.bench.offpolicy import CONFIGS, DEMO, LR, STALENESS, run_overrides
from rollyard.cli import _register, app, main
from rollyard.core.errors import ConfigError
from rollyard.rl.corrections import WEIGHT_KINDS, CorrectionKind
from rollyard.rollout.config import Config, builtin_config


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


def test_work_and_max_runs_are_refused_by_benches_that_do_not_take_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv, said in (
        (["sandbox", "--work", str(tmp_path)], "--work applies to drafting-eagle, offpolicy only"),
        (["drafting", "--work", str(tmp_path)], "--work applies to drafting-eagle, offpolicy only"),
        (["sandbox", "--max-runs", "2"], "--max-runs applies to drafting-eagle, offpolicy only"),
        (["offpolicy", "--max-runs", "2"], "--max-runs needs --work DIR"),
    ):
        monkeypatch.setattr(sys, "argv", ["rollyard", "bench", *argv])
        with pytest.raises(SystemExit) as exit_:
            main()
        assert exit_.value.code == 1
        assert said in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before anything ran


def _timeless(runs: dict[str, list[dict[str, Any]]]) -> dict[str, list[dict[str, Any]]]:
    return {n: [{k: v for k, v in r.items() if k != "wall_s"} for r in rs] for n, rs in runs.items()}


def _config_name(cfg: Config) -> str:
    return "onpolicy" if cfg.run.mode == "sync" else cfg.trainer.correction.kind.value


@pytest.fixture
def trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """offpolicy.main without vLLM: its engine and restore are no-ops and its trainer returns
    metrics rows that depend on the seed, the config and the steps; the runs it was called for."""
    calls: list[str] = []

    @contextmanager
    def engine(seed: int, root: Path) -> Iterator[tuple[Path, str]]:
        yield tmp_path / f"warm{seed}", "http://127.0.0.1:1"

    async def train(cfg: Config, root: Path) -> list[dict[str, Any]]:
        name = _config_name(cfg)
        assert not root.exists()  # every run starts from an empty run dir
        (root / "weights" / "v000001").mkdir(parents=True)
        (root / "checkpoint").mkdir()
        (root / "metrics.jsonl").write_text("{}\n")
        calls.append(f"{cfg.run.seed}-{name}")
        i = CONFIGS.index(name)
        rows: list[dict[str, Any]] = [{"step": 0, "eval_success": 0.5 + 0.01 * cfg.run.seed}]
        for step in range(1, cfg.run.steps + 1):
            kl = 0.001 * (i + 1) * step + 0.0001 * cfg.run.seed
            rows.append({"step": step, "train_behaviour_kl": kl, "train_grad_norm": 0.1 * step})
        rows[-1]["eval_success"] = (i + 3 * cfg.run.seed) / 30
        return rows

    async def restore(url: str, model: Path) -> None:
        return None

    monkeypatch.setattr(offpolicy, "_engine", engine)
    monkeypatch.setattr(offpolicy, "_train", train)
    monkeypatch.setattr(offpolicy, "_restore", restore)
    monkeypatch.setattr(rollyard.bench._report, "RESULTS_DIR", tmp_path / "results")
    return calls


def test_a_bench_in_pieces_reuses_finished_runs_and_sums_up_as_one_call(
    tmp_path: Path,
    trained: list[str],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    every = [f"{s}-{n}" for s in range(2) for n in CONFIGS]
    whole = offpolicy.main(steps=2, seeds=2)  # today's behaviour: a temporary directory
    assert trained == every and whole["details"]["reused_runs"] == []
    assert whole["summary"]["seeds"] == 2 and whole["summary"]["icepop"] == (6 + 3 * 0.5) / 30
    trained.clear()

    work = tmp_path / "work"
    first = offpolicy.main(steps=2, seeds=2, work=work, max_runs=5)
    assert trained == every[:5]
    assert sorted(p.name for p in work.glob("*.json")) == sorted(f"{r}.json" for r in every[:5])
    assert first["summary"]["seeds"] == 1 and "geo_mask" not in first["summary"]
    # a piece says it is one: 5 of the 14 runs, and which are missing; the whole says nothing
    assert first["summary"]["partial"] == "5/14" and first["details"]["missing_runs"] == every[5:]
    assert "partial" not in whole["summary"] and whole["details"]["missing_runs"] == []
    run_dir = work / "seed0-onpolicy"  # the run dirs live under --work too, less their weights
    assert (run_dir / "metrics.jsonl").is_file() and not {"weights", "checkpoint"} & set(os.listdir(run_dir))
    stored = json.loads((work / "0-none.json").read_text())
    key = stored["key"]
    assert (key["lr"], key["staleness"], key["steps"], key["seed"]) == (LR, STALENESS, 2, 0)
    assert key["rows"] == offpolicy.ROWS
    assert str(tmp_path) not in json.dumps(key)  # no path: a row is reused from another clone too
    assert stored["row"] == first["details"]["runs"]["none"][0]

    # a row half-written when the session ended: its tmp file is ignored and the run redone
    (work / ".0-geo_mask.json.tmp").write_text('{"key": {"bench": "offp')
    trained.clear()
    second = offpolicy.main(steps=2, seeds=2, work=work)
    assert trained == every[5:]  # the patched trainer was not called for the five reused
    assert second["details"]["reused_runs"] == every[:5]
    assert f"reused={','.join(every[:5])} running={','.join(every[5:])}" in capsys.readouterr().err
    assert second["summary"] == whole["summary"]
    assert _timeless(second["details"]["runs"]) == _timeless(whole["details"]["runs"])
    measured = second["details"]["measured"]
    assert set(measured) == set(every) and [r for r in every if measured[r]["reused"]] == every[:5]
    assert all(m["at"] and m["loadavg"] for m in measured.values())

    # a row made under another key (here: another learning rate) is redone and overwritten
    row = json.loads((work / "1-seq_tis.json").read_text())
    row["key"]["lr"] = LR * 2
    (work / "1-seq_tis.json").write_text(json.dumps(row))
    trained.clear()
    with caplog.at_level(logging.WARNING, logger="rollyard.bench._resume"):
        third = offpolicy.main(steps=2, seeds=2, work=work)
    assert trained == ["1-seq_tis"] and "1-seq_tis.json has another key" in caplog.text
    assert json.loads((work / "1-seq_tis.json").read_text())["key"]["lr"] == LR
    assert third["summary"] == whole["summary"]
    # a row with the right key but no row in it (edited, or written by other code): redone
    del row["row"]
    row["key"]["lr"] = LR
    (work / "1-seq_tis.json").write_text(json.dumps(row))
    trained.clear()
    with caplog.at_level(logging.WARNING, logger="rollyard.bench._resume"):
        assert offpolicy.main(steps=2, seeds=2, work=work)["summary"] == whole["summary"]
    assert trained == ["1-seq_tis"] and "1-seq_tis.json has no row" in caplog.text
    trained.clear()
    assert offpolicy.main(steps=3, seeds=2, work=work, max_runs=1)["details"]["reused_runs"] == []
    assert trained == ["0-onpolicy"]  # other steps: no row is the same run


def test_the_cli_passes_work_and_max_runs_through(tmp_path: Path, trained: list[str]) -> None:
    work = tmp_path / "work"
    offpolicy.main(steps=2, seeds=1, work=work)  # seed 0's seven rows
    trained.clear()
    _register()
    args = ["bench", "offpolicy", "--steps", "2", "--work", str(work)]
    res = CliRunner().invoke(app, [*args, "--seeds", "2", "--max-runs", "1"])
    assert res.exit_code == 0, res.output
    assert trained == ["1-onpolicy"]  # seed 0 reused, one new run
    assert res.output.strip().splitlines()[-1].startswith("offpolicy: onpolicy=")
    trained.clear()
    assert CliRunner().invoke(app, [*args, "--seeds", "1"]).exit_code == 0 and trained == []


def test_work_that_is_a_file_is_refused_with_a_clear_error(tmp_path: Path, trained: list[str]) -> None:
    (tmp_path / "work").write_text("not a directory")
    with pytest.raises(ConfigError, match="is a file: give a directory"):
        offpolicy.main(steps=2, seeds=1, work=tmp_path / "work")
    assert trained == []


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
