"""Shared fixtures: a real bubblewrap provider and a small generated task set."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks import Task, generate, load_task


@pytest.fixture(scope="session")
def provider() -> SandboxProvider:
    bwrap = pytest.importorskip("rollyard.sandbox.bwrap", reason="the bwrap provider has not landed")
    try:
        return bwrap.BwrapProvider()  # type: ignore[no-any-return]
    except Exception as e:  # no bubblewrap on this host
        pytest.skip(f"bubblewrap unavailable: {e}")


@pytest.fixture()
def make_task(tmp_path: Path) -> Callable[..., Task]:
    def make(family: str = "lookup", seed: int = 0, i: int = 0) -> Task:
        paths = generate(family, tmp_path / f"{family}-{seed}", i + 1, seed, overwrite=True)
        return load_task(paths[i])

    return make


@pytest.fixture()
def sandbox_dirs(provider: SandboxProvider) -> Callable[[], set[str]]:
    """A function listing sandbox directories under the provider's root (to detect leaks)."""

    def listing() -> set[str]:
        root: Path = provider.root  # type: ignore[attr-defined]
        return {p.name for p in root.iterdir() if not p.name.startswith(".")}

    return listing
