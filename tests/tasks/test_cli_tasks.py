from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollyard.cli import _register, app
from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks import load_tasks


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def test_generate_then_validate_writes_a_report_and_a_kept_list(
    runner: CliRunner, provider: SandboxProvider, tmp_path: Path
) -> None:
    res = runner.invoke(app, ["tasks", "generate", "sums", str(tmp_path / "t"), "--n", "2", "--seed", "3"])
    assert res.exit_code == 0, res.output
    assert "wrote 2 sums tasks" in res.output
    out = tmp_path / "v"
    res = runner.invoke(app, ["tasks", "validate", str(tmp_path / "t"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "kept 2, dropped 0" in res.output
    assert len(load_tasks(out / "kept.txt")) == 2


def test_validate_rejects_a_judge_url_without_models(runner: CliRunner, tmp_path: Path) -> None:
    runner.invoke(app, ["tasks", "generate", "lookup", str(tmp_path / "t"), "--n", "1"])
    res = runner.invoke(app, ["tasks", "validate", str(tmp_path / "t"), "--judge-url", "http://x/v1"])
    assert res.exit_code != 0
    assert "--judge-model" in str(res.exception)
