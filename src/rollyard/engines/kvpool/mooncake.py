"""The Mooncake store's master, started for a run's engines when ``engine.kv_pool.master`` is unset.

Mooncake (PyPI ``mooncake-transfer-engine-non-cuda``; its store library needs Debian
``libibverbs1``) keeps KV blocks in memory segments the engines contribute
(``segment_mb`` each) and a master process that indexes them; vLLM's ``MooncakeStoreConnector``
keys blocks by vLLM's own block hashes (sha256 by default, the same in every process), so one
engine loads the prefix another computed. The master runs in its own process group and is
stopped with the fleet.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from rollyard.core.errors import ConfigError, EngineStartError
from rollyard.core.net import free_port

log = logging.getLogger(__name__)


def master_binary() -> str:
    """``mooncake_master`` beside this interpreter (the venv's), else on PATH."""
    here = Path(sys.executable).parent / "mooncake_master"
    found = str(here) if here.exists() else shutil.which("mooncake_master")
    if not found:
        raise ConfigError(
            "engine.kv_pool.kind=mooncake needs the mooncake-transfer-engine-non-cuda package "
            "(pip install mooncake-transfer-engine-non-cuda; apt-get install libibverbs1)"
        )
    return found


def write_client_config(path: Path, master: str, segment_mb: int) -> Path:
    """The file ``MOONCAKE_CONFIG_PATH`` names for an engine (written, then renamed)."""
    doc = {
        "metadata_server": "P2PHANDSHAKE",  # engines exchange segment addresses directly
        "master_server_address": master,
        "protocol": "tcp",
        "device_name": "",
        "global_segment_size": f"{segment_mb}MB",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, path)
    return path


class MooncakeMaster:
    """A local ``mooncake_master`` on free ports; ``address`` is what engines dial."""

    def __init__(self, log_path: Path, host: str = "127.0.0.1") -> None:
        self.log_path = log_path
        self.host = host
        self.port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 30.0) -> MooncakeMaster:
        self.port = free_port()
        args = [
            master_binary(),
            f"-rpc_port={self.port}",
            f"-rpc_address={self.host}",
            f"-metrics_port={free_port()}",  # its default (9003) would clash between runs
        ]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                args, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise EngineStartError(
                    f"mooncake_master exited with code {self.proc.returncode} (log {self.log_path})"
                )
            with socket.socket() as s:
                s.settimeout(0.5)
                if s.connect_ex((self.host, self.port)) == 0:
                    log.info("mooncake master up address=%s", self.address)
                    return self
            time.sleep(0.2)
        self.stop()
        raise EngineStartError(f"mooncake_master did not listen on {self.address} within {timeout_s:.0f} s")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
