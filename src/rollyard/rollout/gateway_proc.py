"""The run's gateway: a child process (``rollyard.gateway.process``), started and stopped here.

It runs apart from the trainer so that a training step, a checkpoint or a publish never holds
the event loop that serves every program's requests (one interpreter lock between them made
the gateway's loop lag follow the trainer's Python). The run talks to it only through its admin
API (``GatewayClient``); the engines' version fences live in it (``RemoteFenced``).

The child runs in a session of its own, so a terminal's Ctrl-C reaches only the run, which then
stops it in order (programs first, then the gateway: in-flight requests drain, the journal
closes); it also ends itself if the run's process dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from rollyard.core.errors import EngineStartError
from rollyard.core.net import WILDCARDS, advertised_url, free_port
from rollyard.gateway.process import DRAIN_S, EngineSpec, GatewayProcessSpec
from rollyard.rollout.config import Config
from rollyard.rollout.episode import MODEL_NAME
from rollyard.rollout.gateway_client import GatewayClient
from rollyard.rollout.remote_fence import RemoteFenced
from rollyard.rollout.rundir import write_atomic

log = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0  # imports and the tokenizer on a loaded 2-core machine
STOP_TIMEOUT_S = DRAIN_S + 15.0


@dataclass
class GatewayServer:
    client: GatewayClient
    url: str
    admin_token: str
    proc: subprocess.Popen[bytes]
    closing: bool = False  # set first at teardown: a program ending now must not touch the gateway
    socket_path: Path | None = None  # the sandboxes' door (black-box agents), when served
    advertised_url: str = ""  # how workers on other machines reach it (``gateway.advertise``)

    async def stop(self) -> None:
        """SIGTERM: the gateway stops accepting, drains its requests (``DRAIN_S``), closes its
        journal and exits; SIGKILL if it has not after ``STOP_TIMEOUT_S``."""
        self.closing = True
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.error("the gateway did not stop in %.0f s; killing it", STOP_TIMEOUT_S)
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
        await self.client.aclose()
        if self.socket_path is not None:
            shutil.rmtree(self.socket_path.parent, ignore_errors=True)

    def kill(self) -> None:
        """The forced-exit path: SIGKILL now."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()


def gateway_spec(
    cfg: Config, run_dir: Path, backends: list[RemoteFenced], model_dir: Path, port: int, uds: Path | None
) -> GatewayProcessSpec:
    """What the gateway process serves, from the run's config."""
    s = cfg.gateway.scheduling
    policy = {
        "policy": s.policy,
        "router": s.router,
        "admission": s.admission,
        "order": s.order,
        "tick_s": s.tick_s,
    }
    return GatewayProcessSpec(
        engines=[
            EngineSpec(
                name=b.name, url=b.url, version=b.policy_version, max_model_len=cfg.engine.max_model_len
            )
            for b in backends
        ],
        model_dir=model_dir,
        model_name=MODEL_NAME,
        journal=run_dir / "journal.db",
        host=cfg.gateway.host,
        port=port,
        uds=uds,
        capacity=cfg.gateway.capacity,
        policy={**{k: v for k, v in policy.items() if v is not None}, **s.options},
        divide_tokens=cfg.gateway.divided.chunk_tokens if cfg.gateway.divided else None,
        limits=cfg.gateway.limits,
    )


async def start_gateway(
    cfg: Config, run_dir: Path, backends: list[RemoteFenced], model_dir: Path, *, uds: bool = False
) -> GatewayServer:
    """The gateway process on the run's engines, journal in the run dir; with ``uds``, also on a
    unix socket in a fresh short /tmp dir (socket paths must stay under 108 bytes) that sandboxes
    of black-box agents reach. Once it answers, ``backends`` take their fences from it."""
    token = "rya-" + secrets.token_urlsafe(24)
    port = cfg.gateway.port or free_port()
    socket_path = Path(tempfile.mkdtemp(prefix="ry-gw-", dir="/tmp")) / "gw.sock" if uds else None
    spec = gateway_spec(cfg, run_dir, backends, model_dir, port, socket_path)
    spec_path = run_dir / "gateway.json"
    write_atomic(spec_path, spec.model_dump_json(indent=1))
    log_path = run_dir / "logs" / "gateway.log"
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            [sys.executable, "-m", "rollyard.gateway.process", str(spec_path)],
            env={**os.environ, "ROLLYARD_ADMIN_TOKEN": token},
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # the run's Ctrl-C is the run's: it stops the gateway in order
        )
    host = "127.0.0.1" if cfg.gateway.host in WILDCARDS else cfg.gateway.host
    url = f"http://{host}:{port}"
    server = GatewayServer(GatewayClient(url, token), url, token, proc, socket_path=socket_path)
    try:
        await _wait_ready(server, log_path)
    except BaseException:
        server.kill()
        await server.stop()
        raise
    server.advertised_url = advertised_url(cfg.gateway.host, port, cfg.gateway.advertise)
    for b in backends:
        b.gateway = server.client
    log.info(
        "gateway up pid=%d url=%s socket=%s advertised=%s", proc.pid, url, socket_path, server.advertised_url
    )
    return server


async def _wait_ready(server: GatewayServer, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise EngineStartError(
                    f"the gateway exited during start-up (code {server.proc.returncode}):\n{tail}"
                )
            with contextlib.suppress(httpx.HTTPError):
                up = (await http.get(f"{server.url}/health")).status_code == 200
                if up and (server.socket_path is None or server.socket_path.exists()):
                    return
            await asyncio.sleep(0.1)
    raise EngineStartError(
        f"the gateway did not answer on {server.url} within {START_TIMEOUT_S:.0f} s ({log_path})"
    )
