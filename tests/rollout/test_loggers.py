"""Every metrics row also reaches TensorBoard and W&B (offline), as numbers."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rollyard.rollout.loggers import Trackers, open_trackers, scalars


def test_only_finite_numbers_are_scalars() -> None:
    row = {"loss": 0.5, "step": 3, "ok": True, "groups": ["g1"], "bad": math.nan, "name": "x"}
    assert scalars(row) == {"loss": 0.5, "step": 3.0, "ok": 1.0}


def test_tensorboard_gets_every_numeric_metric_and_reads_back(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trackers = open_trackers(["jsonl", "tensorboard"], tmp_path, {})
    for step in (1, 2):
        trackers.log({"step": step, "loss": 1.0 / step, "groups": ["a"]})
    trackers.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("loss")] == [(1, 1.0), (2, 0.5)]
    assert "groups" not in acc.Tags()["scalars"]


def test_wandb_runs_offline_into_the_run_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    trackers = open_trackers(["wandb"], tmp_path, {"run": {"steps": 2}})
    trackers.log({"step": 1, "loss": 0.25})
    trackers.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and any(runs[0].glob("*.wandb"))


def test_a_failing_tracker_never_stops_training() -> None:
    class Broken:
        def log(self, row: dict[str, object], step: int) -> None:
            raise OSError("disk full")

        def close(self) -> None:
            raise OSError("disk full")

    trackers = Trackers([Broken()])
    trackers.log({"step": 1, "loss": 1.0})
    trackers.close()
