"""A real bubblewrap provider, and a real `rollyard gateway` process, for the agent tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollyard.engines.launcher import free_port
from rollyard.sandbox.base import SandboxProvider


@pytest.fixture(scope="session")
def provider() -> SandboxProvider:
    bwrap = pytest.importorskip("rollyard.sandbox.bwrap", reason="the bwrap provider has not landed")
    try:
        return bwrap.BwrapProvider()  # type: ignore[no-any-return]
    except Exception as e:  # no bubblewrap on this host
        pytest.skip(f"bubblewrap unavailable: {e}")


ADMIN = "blackbox-e2e-admin"


@pytest.fixture(scope="module")
def gateway(vllm_url: str, tiny_model_dir: Path) -> Iterator[tuple[str, Path]]:
    """`rollyard gateway --uds`: yields its TCP URL (admin) and its unix socket (sandboxes)."""
    sock_dir = Path(tempfile.mkdtemp(prefix="ry-gw-", dir="/tmp"))
    state = Path(tempfile.mkdtemp(prefix="ry-gw-state-"))
    sock, port = sock_dir / "gw.sock", free_port()
    cmd = [sys.executable, "-m", "rollyard", "gateway", "--engine", vllm_url, "--port", str(port)]
    cmd += ["--model-dir", str(tiny_model_dir), "--model-name", "tiny", "--state-dir", str(state)]
    cmd += ["--uds", str(sock)]
    proc = subprocess.Popen(cmd, env={**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/health").status_code == 200 and sock.exists():
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, "gateway exited during start-up"
            time.sleep(0.1)
        yield url, sock
    finally:
        proc.terminate()
        proc.wait(15)
        shutil.rmtree(sock_dir, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


def new_program(url: str) -> dict[str, str]:
    body = {"group_id": "g-bb", "task_id": "t-bb", "sampling": {"temperature": 1.0, "max_tokens": 24}}
    r = httpx.post(f"{url}/programs", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return r.json()  # type: ignore[no-any-return]
