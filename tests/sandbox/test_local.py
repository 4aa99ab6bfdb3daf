"""The unisolated local provider: only on explicit opt-in, same protocol, same cleanup."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.core.errors import ConfigError, SandboxError
from rollyard.sandbox import LocalProvider, SandboxSpec


def test_the_local_provider_refuses_to_start_without_explicit_opt_in(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unsafe=True"):
        LocalProvider(tmp_path)


async def test_local_sandboxes_run_in_their_workspace_and_leave_nothing(tmp_path: Path) -> None:
    prov = LocalProvider(tmp_path, unsafe=True)
    sb = await prov.create(SandboxSpec(env={"A": "1"}))
    await sb.write("f.txt", "hi\n")
    r = await sb.exec("cat f.txt; echo $A; pwd", timeout=5)
    assert r.stdout.split() == ["hi", "1", str(sb.workspace)]
    r = await sb.exec("sleep 30", timeout=0.3)
    assert r.timed_out
    await sb.close()
    assert list(tmp_path.iterdir()) == [] and sb.leaked == 0


async def test_local_sandboxes_cannot_bind_paths(tmp_path: Path) -> None:
    prov = LocalProvider(tmp_path, unsafe=True)
    with pytest.raises(SandboxError, match="bind"):
        await prov.create(SandboxSpec(ro_binds=[(tmp_path, Path("/x"))]))


async def test_a_detached_child_holding_stdout_does_not_hang_exec(tmp_path: Path) -> None:
    import time

    prov = LocalProvider(tmp_path, unsafe=True)
    sb = await prov.create(SandboxSpec())
    t0 = time.monotonic()
    r = await sb.exec("setsid sleep 4 & echo started", timeout=10)
    assert r.stdout == "started\n" and not r.timed_out
    assert time.monotonic() - t0 < 3.5
    await sb.close()
