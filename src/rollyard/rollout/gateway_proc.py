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

from rollyard.core.errors import ConfigError, EngineStartError
from rollyard.core.net import advertised_url, free_ports
from rollyard.engines.kvpool.config import kv_bytes_per_token
from rollyard.engines.launcher import serving_dtype
from rollyard.gateway.process import DRAIN_S, EngineSpec, GatewayProcessSpec
from rollyard.gateway.shards import ShardLayout
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
    layout: ShardLayout  # one shard unless ``gateway.workers``; shard k on port + k
    admin_token: str
    proc: subprocess.Popen[bytes]
    spec_path: Path  # what it serves (re-read by a restarted shard)
    closing: bool = False  # set first at teardown: a program ending now must not touch the gateway
    advertise: str | None = None  # ``gateway.advertise``: how workers on other machines reach it

    @property
    def url(self) -> str:
        """Shard 0's address on this host (its admin API reaches every program)."""
        return self.layout.url_of(0)

    @property
    def socket_path(self) -> Path | None:
        """Shard 0's unix socket (the sandboxes' door, when served); shard k's: ``socket_of(k)``."""
        return self.layout.uds_of(0)

    @property
    def advertised_url(self) -> str:
        return self.url_of(0, remote=True)

    def url_of(self, shard: int, *, remote: bool = False) -> str:
        """Where a program on ``shard`` is reached: from this host, or from another machine."""
        if remote:
            return advertised_url(self.layout.host, self.layout.port_of(shard), self.advertise)
        return self.layout.url_of(shard)

    def socket_of(self, shard: int) -> Path | None:
        return self.layout.uds_of(shard)

    def note_versions(self, backends: list[RemoteFenced]) -> None:
        """Write the engines' live versions into the gateway's spec: a shard the supervisor
        restarts reads it again, and must stamp turns with the version served now, not the
        version the run started with."""
        spec = GatewayProcessSpec.model_validate_json(self.spec_path.read_text())
        live = {b.name: b.policy_version for b in backends}
        engines = [e.model_copy(update={"version": live.get(e.name, e.version)}) for e in spec.engines]
        write_atomic(self.spec_path, spec.model_copy(update={"engines": engines}).model_dump_json(indent=1))

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
            shutil.rmtree(self.socket_path.parent, ignore_errors=True)  # every shard's socket

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
                name=b.name,
                url=b.url,
                version=b.policy_version,
                max_model_len=cfg.engine.max_model_len,
                role=role,
            )
            for b, role in zip(backends, cfg.engine.roles(), strict=True)
        ],
        model_dir=model_dir,
        model_name=MODEL_NAME,
        journal=run_dir / "journal.db",
        host=cfg.gateway.host,
        port=port,
        uds=uds,
        capacity=cfg.gateway.capacity,
        workers=cfg.gateway.workers,
        policy={
            **{k: v for k, v in policy.items() if v is not None},
            **pool_options(cfg, model_dir),
            **s.options,
        },
        divide_tokens=cfg.gateway.divided.chunk_tokens if cfg.gateway.divided else None,
        pd_min_prompt_tokens=cfg.gateway.pd_min_prompt_tokens,
        limits=cfg.gateway.limits,
    )


def pool_options(cfg: Config, model_dir: Path) -> dict[str, float]:
    """``pool_load_tok_s`` from ``engine.kv_pool`` (its rate in bytes/s over the model's KV bytes
    per token), so moves and restores charge a load instead of a re-prefill; an explicit
    ``gateway.scheduling.options.pool_load_tok_s`` wins (the caller puts options last)."""
    pool = cfg.engine.kv_pool
    if not pool.enabled:
        return {}
    try:
        size = kv_bytes_per_token(model_dir, serving_dtype())
    except ConfigError as e:  # a cost estimate: the run goes on, pricing moves as re-prefills
        log.warning("kv_pool: %s; the scheduler assumes no pool (pool_load_tok_s 0)", e.message)
        return {}
    return {"pool_load_tok_s": round(pool.load_tok_s(size), 1)}


async def start_gateway(
    cfg: Config, run_dir: Path, backends: list[RemoteFenced], model_dir: Path, *, uds: bool = False
) -> GatewayServer:
    """The gateway process on the run's engines, journal in the run dir; with ``uds``, also on a
    unix socket in a fresh short /tmp dir (socket paths must stay under 108 bytes) that sandboxes
    of black-box agents reach. Once it answers, ``backends`` take their fences from it."""
    token = "rya-" + secrets.token_urlsafe(24)
    port = cfg.gateway.port or free_ports(cfg.gateway.workers)
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
    layout = spec.layout(0)
    urls = [layout.url_of(k) for k in range(layout.count)]
    server = GatewayServer(
        GatewayClient(urls, token), layout, token, proc, spec_path, advertise=cfg.gateway.advertise
    )
    try:
        await _wait_ready(server, log_path)
    except BaseException:
        server.kill()
        await server.stop()
        raise
    for b in backends:
        b.gateway = server.client
    log.info(
        "gateway up pid=%d url=%s socket=%s advertised=%s shards=%d",
        proc.pid,
        server.url,
        socket_path,
        server.advertised_url,
        layout.count,
    )
    return server


async def _answers(http: httpx.AsyncClient, url: str, socket: Path | None) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return (await http.get(f"{url}/health")).status_code == 200 and (socket is None or socket.exists())
    return False


async def _wait_ready(server: GatewayServer, log_path: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    async with httpx.AsyncClient(timeout=2.0, trust_env=False) as http:
        while time.monotonic() < deadline:
            if server.proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise EngineStartError(
                    f"the gateway exited during start-up (code {server.proc.returncode}):\n{tail}"
                )
            if all(
                [
                    await _answers(http, server.url_of(k), server.socket_of(k))
                    for k in range(server.layout.count)
                ]
            ):
                return
            await asyncio.sleep(0.1)
    raise EngineStartError(
        f"the gateway did not answer on {server.url} within {START_TIMEOUT_S:.0f} s ({log_path})"
    )
