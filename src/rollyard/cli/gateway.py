"""``rollyard gateway`` (serve) and ``rollyard export`` (journal to Parquet)."""

from __future__ import annotations

import functools
from pathlib import Path

import typer

from rollyard.cli import app


@app.command("gateway")
def gateway(
    engine: list[str] = typer.Option(..., help="engine base URL (repeat for several)"),
    port: int = typer.Option(8800, help="port to listen on"),
    host: str = typer.Option("127.0.0.1", help="address to bind"),
    model_dir: Path | None = typer.Option(None, help="model dir (tokenizer); default: ask the engine"),
    model_name: str | None = typer.Option(None, help="model name to advertise"),
    state_dir: Path = typer.Option(Path("runs/gateway"), help="journal and admin-token directory"),
    admin_token: str | None = typer.Option(None, envvar="ROLLYARD_ADMIN_TOKEN", help="admin token"),
    strict_model: bool = typer.Option(False, help="reject requests naming another model"),
    capacity: int = typer.Option(256, help="concurrent requests sent to each engine"),
    uds: Path | None = typer.Option(None, help="also serve on this unix socket (what sandboxes reach)"),
    tcp: bool = typer.Option(True, help="serve on --host/--port (--no-tcp: the unix socket only)"),
    policy: str = typer.Option(
        "fifo",
        help="scheduling policy: fifo, thunder, rollyard, seer, group_bound; "
        "NAME,key=value,... sets parts and options (rollyard,max_hold_s=20)",
    ),
    divide_tokens: int = typer.Option(
        0, min=0, help="divided rollout: generate in chunks of this many tokens, rescheduled (0: off)"
    ),
    max_body_bytes: int = typer.Option(8 * 1024 * 1024, help="largest request body accepted (413 above)"),
    max_body_objects: int = typer.Option(
        50_000, min=1, help="JSON objects and arrays a model request may hold (400 above)"
    ),
    open_metrics: bool = typer.Option(False, help="serve /metrics without the admin token"),
    header_timeout_s: float = typer.Option(
        10.0, min=0.001, help="close a connection whose request headers take longer"
    ),
    body_timeout_s: float = typer.Option(
        60.0, min=0.001, help="close a connection whose request body takes longer"
    ),
    max_header_bytes: int = typer.Option(64 * 1024, min=1024, help="largest request headers (431 above)"),
    max_conns_per_peer: int = typer.Option(1024, min=1, help="TCP connections one address may hold"),
    error_budget: int = typer.Option(
        20, help="failed requests per minute before a program gets 429 (0: off)"
    ),
    engine_timeout_s: float = typer.Option(
        600.0, help="an engine call silent this long fails (503; a stream within 1.25x of it)"
    ),
    program_idle_ttl_s: float = typer.Option(
        3600.0, min=0, help="terminate a program idle this long (status idle_timeout; 0: never)"
    ),
    workers: int = typer.Option(
        1,
        min=1,
        help="gateway shards, one process each: shard k serves on port+k with journal-k.db and "
        "1/N of every engine; a program lives on the shard its creation answer names",
    ),
) -> None:
    """Serve the OpenAI/Anthropic-compatible gateway in front of the engines."""
    from rollyard.gateway.serve import serve
    from rollyard.gateway.settings import GatewayLimits
    from rollyard.gateway.workers import serve_workers

    limits = GatewayLimits(
        max_body_bytes=max_body_bytes,
        max_body_objects=max_body_objects,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
        max_header_bytes=max_header_bytes,
        max_conns_per_peer=max_conns_per_peer,
        open_metrics=open_metrics,
        error_budget=error_budget,
        engine_timeout_s=engine_timeout_s,
        program_idle_ttl_s=program_idle_ttl_s,
    )

    run = serve if workers == 1 else functools.partial(serve_workers, workers)
    run(
        engine,
        model_dir=model_dir,
        model_name=model_name,
        host=host,
        port=port,
        state_dir=state_dir,
        admin_token=admin_token,
        strict_model=strict_model,
        capacity=capacity,
        uds=uds,
        tcp=tcp,
        policy=policy,
        divide_tokens=divide_tokens or None,
        limits=limits,
    )


@app.command("export")
def export(
    out: Path = typer.Option(..., help="output .parquet file"),
    group: str | None = typer.Option(None, help="group id (default: every program)"),
    journal: Path = typer.Option(
        Path("runs/gateway"), help="gateway journal, or its state directory (every shard's journal)"
    ),
) -> None:
    """Export recorded trajectories from the gateway journal to Parquet."""
    from rollyard.gateway.serve import export_group

    n = export_group(journal, group, out)
    typer.echo(f"wrote {n} trajectories to {out}")
