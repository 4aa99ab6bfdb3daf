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


@pytest.fixture
def sandbox_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="ry-sbx-test-"))
    os.chmod(root, 0o711)
    yield root
    leftovers = [p.name for p in root.iterdir() if p.name != ".etc"]
    shutil.rmtree(root, ignore_errors=True)
    assert leftovers == [], f"sandbox directories left behind: {leftovers}"


@pytest.fixture
async def provider(sandbox_root: Path) -> AsyncIterator[BwrapProvider]:
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap is not installed")
    yield BwrapProvider(sandbox_root)
