"""Real bubblewrap sandboxes under a throw-away root; every test checks nothing is left behind."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from rollyard.sandbox.bwrap import BwrapProvider

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")


@pytest.fixture(scope="session")
def _session_root() -> Iterator[Path]:
    """One root for the session, so the sandboxes' /etc is built once."""
    root = Path(tempfile.mkdtemp(prefix="ry-sbx-test-"))
    os.chmod(root, 0o711)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def sandbox_root(_session_root: Path) -> Iterator[Path]:
    """The session root; whatever a test leaves in it besides the shared /etc fails that test."""
    yield _session_root
    leftovers = [p.name for p in _session_root.iterdir() if not p.name.startswith(".etc-")]
    for name in leftovers:
        shutil.rmtree(_session_root / name, ignore_errors=True)
    assert leftovers == [], f"sandbox directories left behind: {leftovers}"


@pytest.fixture
async def provider(sandbox_root: Path) -> AsyncIterator[BwrapProvider]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    yield BwrapProvider(sandbox_root)
