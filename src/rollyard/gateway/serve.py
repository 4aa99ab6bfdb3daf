"""Run the gateway process: engines from URLs, tokenizer from the model dir, uvicorn in front.

It listens on TCP, on a unix socket, or both (one uvicorn server over both sockets). The unix
socket is what black-box sandboxes reach (their directory is bound in, a forwarder relays to
it): its directory is 0755 and the socket 0777 so the sandbox's unprivileged uid can connect,
which grants nothing by itself: every model request still needs its program's key, and admin
endpoints are refused on the socket (``edge.not_on_sandbox_socket``).
"""

from __future__ import annotations

import logging
import os
import socket
import stat
from pathlib import Path
from typing import Any

import httpx

from rollyard.core.errors import ConfigError
from rollyard.core.tables import write_parquet
from rollyard.engines.access import engine_http
from rollyard.gateway.app import build_gateway, create_app
from rollyard.gateway.heap import tune_heap
from rollyard.gateway.programs import resolve_admin_token
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.settings import GatewayLimits
from rollyard.gateway.shards import ShardLayout, journals_in
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.sched.registry import policy_from_spec

log = logging.getLogger(__name__)


def discover_model_dir(engine_url: str) -> tuple[Path, str]:
    """The model directory and served name, from the engine's ``/v1/models`` (``root`` is the path)."""
    try:
        with engine_http(timeout=10) as client:
            card = client.get(engine_url.rstrip("/") + "/v1/models").json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"cannot ask {engine_url} for its model ({e}); pass --model-dir") from e
    root = Path(card.get("root") or "")
    if not (root / "tokenizer.json").is_file():
        raise ConfigError(f"engine serves {card.get('root')!r}, not a local model dir; pass --model-dir")
    return root, str(card["id"])


def bind_unix_socket(path: Path, backlog: int = 2048) -> socket.socket:
    """A listening unix socket at ``path`` (dir 0755, socket 0777); a stale socket file is replaced."""
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o755)
    if path.exists() or path.is_symlink():
        if not stat.S_ISSOCK(path.lstat().st_mode):
            raise ConfigError(f"{path} exists and is not a socket; refusing to replace it")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    os.chmod(path, 0o777)
    sock.listen(backlog)
    return sock


def bind_tcp(host: str, port: int, backlog: int = 2048) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    return sock


def uvicorn_config(app: Any, limits: GatewayLimits, **kwargs: Any) -> Any:
    """The server's settings: keep-alive, and the connection guard's slow-client limits."""
    import uvicorn

    from rollyard.gateway.conn_guard import guarded

    kwargs.setdefault("log_level", "warning")
    kwargs.setdefault("timeout_graceful_shutdown", 10)
    return uvicorn.Config(
        app, http=guarded(limits), access_log=False, timeout_keep_alive=limits.keep_alive_s, **kwargs
    )


def serve(
    engines: list[str],
    *,
    model_dir: Path | None,
    model_name: str | None,
    host: str,
    port: int,
    state_dir: Path,
    admin_token: str | None,
    strict_model: bool = False,
    capacity: int = 256,
    uds: Path | None = None,
    tcp: bool = True,
    policy: str = "fifo",
    divide_tokens: int | None = None,
    limits: GatewayLimits | None = None,
    layout: ShardLayout | None = None,
) -> None:
    """Serve until interrupted, on ``host:port`` (unless ``tcp`` is False) and on ``uds`` if given;
    with a ``layout`` of several shards, as its shard ``layout.index`` (``gateway/shards.py``:
    its own port, socket, journal and share of every engine)."""
    from rollyard.engines.vllm import VLLMBackend

    if not engines:
        raise ConfigError("give at least one --engine URL")
    chosen = policy_from_spec(policy)  # an unknown name or option fails before anything starts
    if not tcp and uds is None:
        raise ConfigError("--no-tcp needs --uds PATH (nothing to listen on)")
    found_dir, found_name = (model_dir, model_name) if model_dir else discover_model_dir(engines[0])
    token, token_file = resolve_admin_token(admin_token, state_dir)
    if token_file is not None:
        log.warning("admin token written to %s (mode 0600)", token_file)
        print(f"rollyard gateway: admin token in {token_file}", flush=True)
    limits = limits or GatewayLimits()
    layout = layout or ShardLayout(port=port, uds=uds, host=host)
    port, uds = layout.port_of(layout.index), layout.uds_of(layout.index)
    backends = {
        f"engine{i}": VLLMBackend(url, name=f"engine{i}", timeout_s=limits.engine_timeout_s)
        for i, url in enumerate(engines)
    }
    gw = build_gateway(
        backends,
        FastTokenizer(found_dir),
        layout.journal_of(state_dir, layout.index),
        token,
        model_name or found_name or "model",
        strict_model=strict_model,
        capacity=capacity,
        policy=chosen,
        divide_tokens=divide_tokens,
        share=layout.share,
    )
    import uvicorn

    sockets = [bind_tcp(host, port)] if tcp else []
    if uds is not None:
        sockets.append(bind_unix_socket(uds))
        print(f"rollyard gateway: unix socket {uds}", flush=True)
    # requests held by the scheduler (a paused program) would keep a graceful stop waiting forever
    config = uvicorn_config(create_app(gw, limits=limits, layout=layout), limits)
    tune_heap(freeze=True)
    try:
        uvicorn.Server(config).run(sockets=sockets)
    finally:
        if uds is not None:
            uds.unlink(missing_ok=True)


def export_group(journal: Path, group_id: str | None, out: Path) -> int:
    """Write a group's trajectories (all programs when ``group_id`` is None) to Parquet.

    ``journal`` is a journal file or a gateway's state directory, whose shards' journals are
    all read; trajectories come in the order their programs were created (across shards too,
    so one gateway and several shards export the same workload alike)."""
    paths = journals_in(journal)
    if not paths:
        raise ConfigError(f"no journal at {journal}")
    trajs = []
    for path in paths:
        j = SqliteJournal(path)
        try:
            trajs += [j.trajectory(pid) for pid in j.program_ids(group_id)]
        finally:
            j.close()
    if len(paths) > 1:
        trajs.sort(key=lambda t: (t.metadata["program"]["created_at"], t.program_id))
    write_parquet(out, trajs)
    return len(trajs)
