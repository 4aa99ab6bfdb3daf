"""``rollyard bench --model``: a pretrained model for engine and e2e, a clear error elsewhere."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from rollyard.bench._model import result_name
from rollyard.cli import _register, app
from rollyard.core.errors import ConfigError


@pytest.fixture(scope="module")
def runner() -> CliRunner:
    _register()
    return CliRunner()


def test_an_unknown_model_is_refused_before_anything_runs(runner: CliRunner) -> None:
    res = runner.invoke(app, ["bench", "engine", "--model", "gpt-9"])
    assert isinstance(res.exception, ConfigError)
    assert "smollm2-135m" in str(res.exception)


def test_model_is_refused_by_benches_that_serve_their_own(runner: CliRunner) -> None:
    res = runner.invoke(app, ["bench", "sandbox", "--model", "smollm2-135m"])
    assert isinstance(res.exception, ConfigError)
    assert "engine and e2e only; sandbox" in str(res.exception)


def test_a_pretrained_result_sits_beside_the_tiny_one() -> None:
    assert result_name("engine", "tiny") == "engine"
    assert result_name("e2e", "smollm2-135m") == "e2e-smollm2-135m"


def test_every_listed_benchmark_is_runnable_by_name() -> None:
    """`rollyard bench all` calls main(quick=...) on each: a helper module must not be listed
    (the gateway bench's relay was, and `bench all` would have died on it)."""
    import importlib
    import inspect

    from rollyard.cli.bench import available

    for name in available():
        main = importlib.import_module(f"rollyard.bench.{name.replace('-', '_')}").main
        assert "quick" in inspect.signature(main).parameters, name
