"""Helpers for rollout tests: the quick config pointed at the session's engine and tiny model."""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollyard.rollout.config import Config, builtin_config
from rollyard.rollout.rundir import RunDir


def own_engine_config(model_dir: Path, **overrides: Any) -> Config:
    """The embedded quick config on ``model_dir`` (no model creation, no progress display); the
    run starts its own engines."""
    base = {"model.path": str(model_dir), "model.create": False, "run.progress": False}
    return builtin_config("quick", {**base, **overrides})


def quick_config(model_dir: Path, engine_url: str, **overrides: Any) -> Config:
    """The embedded quick config on the shared engine (no engine start, no model creation)."""
    return own_engine_config(model_dir, **{"engine.urls": [engine_url], **overrides})


def restore_engine(engine_url: str, model_dir: Path) -> None:
    """Put the session engine back on the tiny model's weights (tests that train change them)."""
    from rollyard.engines.vllm import VLLMBackend

    async def go() -> None:
        b = VLLMBackend(engine_url)
        try:
            await b.load_weights(str(model_dir), 0)
        finally:
            await b.aclose()

    asyncio.run(go())


@pytest.fixture
def make_config(tiny_model_dir: Path, vllm_url: str) -> Iterator[Callable[..., Config]]:
    """Quick configs on the session engine; the engine's weights are restored after the test."""
    yield lambda **overrides: quick_config(tiny_model_dir, vllm_url, **overrides)
    restore_engine(vllm_url, tiny_model_dir)


def engine_pids(run: RunDir) -> list[int]:
    """Pids of every engine the run started (from its log), in start order."""
    log = run.logs / "run.log"
    return [int(p) for p in re.findall(r"vllm starting pid=(\d+)", log.read_text())] if log.exists() else []


def wait_for_first_step(
    proc: subprocess.Popen[bytes], run: RunDir, err: Path, timeout_s: float = 420
) -> None:
    """Block until the run has written a metrics row; fail with its stderr if it exits first."""
    deadline = time.monotonic() + timeout_s
    while not run.read_metrics():
        assert proc.poll() is None, err.read_text()[-2000:]
        assert time.monotonic() < deadline, "no step finished in time"
        time.sleep(0.5)
