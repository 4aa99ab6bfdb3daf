from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollyard.cli import _register, app
from rollyard.rollout.report import compare, make_comparison, summarize
from rollyard.rollout.rundir import RunDir


def rows(start: float, end: float) -> list[dict[str, float]]:
    return [
        {"step": 0, "eval_success": start},
        {"step": 1, "reward_mean": 0.5, "wall_s": 2.0},
        {"step": 2, "reward_mean": 0.7, "wall_s": 3.0, "eval_success": end},
    ]


def test_summarize_reads_the_held_out_start_end_and_the_rl_steps_wall() -> None:
    s = summarize(rows(0.5, 0.8))
    assert s["eval_start"] == 0.5 and s["eval_end"] == 0.8
    assert s["eval_gain_points"] == pytest.approx(30.0)
    assert s["rl_steps_wall_s"] == 5.0 and s["steps"] == 2


def test_compare_averages_only_runs_that_were_evaluated() -> None:
    out = compare({"a": rows(0.5, 0.8), "b": rows(0.4, 0.5), "c": [{"step": 1, "reward_mean": 0.1}]})
    assert out["eval_gain_points_mean"] == pytest.approx(20.0)
    assert out["eval_start_mean"] == pytest.approx(0.45)
    assert "eval_start" not in out["runs"]["c"]


def test_report_of_several_runs_writes_each_report_and_the_comparison(tmp_path: Path) -> None:
    dirs = []
    for name, (a, b) in {"seed0": (0.5, 0.8), "seed1": (0.25, 0.5)}.items():
        run = RunDir(tmp_path / name)
        run.root.mkdir()
        for r in rows(a, b):
            run.append_metrics(r)
        dirs.append(run.root)
    _register()
    result = CliRunner().invoke(app, ["report", *map(str, dirs), "--out", str(tmp_path / "cmp")])
    assert result.exit_code == 0, result.output
    text = (tmp_path / "cmp" / "summary.md").read_text()
    assert "| seed0 | 0.500 | 0.800 | 30.0 | 5.0 |" in text
    assert "| mean | 0.375 | 0.650 | 27.5 | |" in text
    assert (tmp_path / "cmp" / "heldout_success.png").stat().st_size > 0
    assert all((d / "report" / "summary.md").is_file() for d in dirs)


def test_a_comparison_of_runs_without_metrics_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="no metrics"):
        make_comparison([tmp_path / "empty", tmp_path / "empty"], tmp_path / "cmp")
