"""A real bubblewrap provider for the agent tests."""

from __future__ import annotations

import pytest

from rollyard.sandbox.base import SandboxProvider


@pytest.fixture(scope="session")
def provider() -> SandboxProvider:
    bwrap = pytest.importorskip("rollyard.sandbox.bwrap", reason="the bwrap provider has not landed")
    try:
        return bwrap.BwrapProvider()  # type: ignore[no-any-return]
    except Exception as e:  # no bubblewrap on this host
        pytest.skip(f"bubblewrap unavailable: {e}")
