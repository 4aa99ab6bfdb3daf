"""Run the gateway process: engines from URLs, tokenizer from the model dir, uvicorn in front."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx

from rollyard.core.errors import ConfigError
from rollyard.core.tables import write_parquet
from rollyard.gateway.app import build_gateway, create_app
from rollyard.gateway.programs import resolve_admin_token
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.tokenizer import FastTokenizer

log = logging.getLogger(__name__)


def discover_model_dir(engine_url: str) -> tuple[Path, str]:
    """The model directory and served name, from the engine's ``/v1/models`` (``root`` is the path)."""
    try:
        card = httpx.get(engine_url.rstrip("/") + "/v1/models", timeout=10).json()["data"][0]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise ConfigError(f"cannot ask {engine_url} for its model ({e}); pass --model-dir") from e
    root = Path(card.get("root") or "")
    if not (root / "tokenizer.json").is_file():
        raise ConfigError(f"engine serves {card.get('root')!r}, not a local model dir; pass --model-dir")
    return root, str(card["id"])


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
) -> None:
    from rollyard.engines.vllm import VLLMBackend

    if not engines:
        raise ConfigError("give at least one --engine URL")
    found_dir, found_name = (model_dir, model_name) if model_dir else discover_model_dir(engines[0])
    token, token_file = resolve_admin_token(admin_token, state_dir)
    if token_file is not None:
        log.warning("admin token written to %s (mode 0600)", token_file)
        print(f"rollyard gateway: admin token in {token_file}", flush=True)
    backends = {f"engine{i}": VLLMBackend(url, name=f"engine{i}") for i, url in enumerate(engines)}
    gw = build_gateway(
        backends,
        FastTokenizer(found_dir),
        state_dir / "journal.db",
        token,
        model_name or found_name or "model",
        strict_model=strict_model,
        capacity=capacity,
    )
    import uvicorn

    uvicorn.run(create_app(gw), host=host, port=port, log_level="warning", access_log=False)


def export_group(journal: Path, group_id: str | None, out: Path) -> int:
    """Write a group's trajectories (all programs when ``group_id`` is None) to Parquet."""
    if not journal.is_file():
        raise ConfigError(f"no journal at {journal}")
    j = SqliteJournal(journal)
    try:
        trajs = [j.trajectory(pid) for pid in j.program_ids(group_id)]
    finally:
        j.close()
    write_parquet(out, trajs)
    return len(trajs)
