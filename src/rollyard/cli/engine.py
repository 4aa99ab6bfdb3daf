"""``rollyard engine serve``: a local vLLM with the right CPU settings."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import typer

from rollyard.cli import app

engine_app = typer.Typer(help="Run inference engines.", no_args_is_help=True)
app.add_typer(engine_app, name="engine")


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM stops the engine the same way Ctrl-C does."""
    raise KeyboardInterrupt


@engine_app.command("serve")
def serve(
    model: Path = typer.Option(..., "--model", help="HF model directory"),
    port: int | None = typer.Option(None, help="port (default: a free one)"),
    host: str = typer.Option(
        "127.0.0.1",
        help="address to serve on; another than loopback exposes the engine to the network, behind "
        "the engine key (ROLLYARD_ENGINE_KEY, else ~/.config/rollyard/engine.key) on every route",
    ),
    kv_tokens: int | None = typer.Option(None, "--kv-tokens", help="cap the KV cache at this many tokens"),
    dtype: str = typer.Option("float32", help="float32 is 4-20x faster than bf16 on CPUs"),
    max_model_len: int = typer.Option(2048, "--max-model-len"),
    log_file: Path | None = typer.Option(None, "--log", help="engine log file (default: a temp file)"),
    timeout: float = typer.Option(300.0, help="seconds to wait for health"),
    drafting: str = typer.Option(
        "none",
        "--drafting",
        help="speculative drafting METHOD[:K]: grouped_suffix (a suffix index per RL group), "
        "solo_suffix, ngram, eagle (needs --draft-head) or none; K tokens at most per step (default 4)",
    ),
    draft_head: Path | None = typer.Option(
        None,
        "--draft-head",
        help="with --drafting eagle: a head dir (a run's weights/vNNNNNN/draft_head, or one made by "
        "a run with engine.drafting.head: auto under the model cache's models/eagle-heads/)",
    ),
    logprobs_mode: str = typer.Option(
        "processed_logprobs",
        "--logprobs-mode",
        help="what the recorded logprobs describe: processed_logprobs (the sampled distribution, "
        "what the trainer's ratios need; a run refuses an attached engine without it) or "
        "raw_logprobs (vLLM's default: the model at T=1)",
    ),
    kv_pool: str = typer.Option(
        "none",
        "--kv-pool",
        help="share KV with other engines (docs/kv-pool.md): none, local[:DIR] (a directory all "
        "engines on this host see) or mooncake:HOST:PORT (a running mooncake_master)",
    ),
    role: str = typer.Option(
        "both", "--role", help="prefill, decode or both: its part in a prefill/decode split (needs --kv-pool)"
    ),
) -> None:
    """Start vLLM, wait until healthy, print its URL, and stop its whole process group on exit."""
    from pydantic import ValidationError

    from rollyard.core.engine_key import KEY_ENV, key_file
    from rollyard.core.errors import ConfigError
    from rollyard.core.net import is_loopback
    from rollyard.engines.drafting import DraftingConfig
    from rollyard.engines.kvpool import KVPoolConfig
    from rollyard.engines.launcher import VLLMServer

    if role not in ("both", "prefill", "decode"):
        raise ConfigError(f"--role {role!r}: prefill, decode or both")
    if logprobs_mode not in ("processed_logprobs", "raw_logprobs"):
        raise ConfigError(f"--logprobs-mode {logprobs_mode!r}: processed_logprobs or raw_logprobs")
    try:
        draft = DraftingConfig.parse(drafting)
    except ValidationError as e:
        raise ConfigError(f"--drafting {drafting!r}: {e.errors()[0]['msg']}") from e
    if (draft.method == "eagle") != (draft_head is not None):
        raise ConfigError("--drafting eagle needs --draft-head DIR, and --draft-head needs --drafting eagle")
    if draft_head is not None:
        from rollyard.engines.drafting.eagle_files import HEAD_FILE

        if not (draft_head / HEAD_FILE).is_file():
            raise ConfigError(f"--draft-head {draft_head}: no {HEAD_FILE} there")
        draft = draft.model_copy(update={"head": str(draft_head)})
    kind, _, at = kv_pool.partition(":")
    where = {"local": {"root": at}, "mooncake": {"master": at}}.get(kind, {}) if at else {}
    try:
        pool = KVPoolConfig.model_validate({"kind": kind, **where})
    except ValidationError as e:
        raise ConfigError(f"--kv-pool {kv_pool!r}: {e.errors()[0]['msg']}") from e
    if role != "both" and not pool.enabled:
        raise ConfigError(f"--role {role} needs --kv-pool: the prompt's KV moves through the pool")
    server = VLLMServer(
        model, port=port, host=host, kv_tokens=kv_tokens, dtype=dtype, max_model_len=max_model_len,
        log_path=log_file, startup_timeout_s=timeout, drafting=draft, kv_pool=pool,
        extra_args=["--logprobs-mode", logprobs_mode], role=role,  # type: ignore[arg-type]
    )  # fmt: skip
    signal.signal(signal.SIGTERM, _interrupt)
    with server:
        typer.echo(f"engine ready: {server.url}  (log: {server.log_path})")
        if not is_loopback(host):
            where = KEY_ENV if os.environ.get(KEY_ENV) else str(key_file())
            typer.echo(f"every route needs the engine key ({where}); give the gateway's host it as {KEY_ENV}")
        try:
            while server.alive():
                time.sleep(1.0)
        except KeyboardInterrupt:
            pass
    if not server.alive():
        typer.echo("engine stopped")


@engine_app.command("demo")
def demo(
    workdir: Path = typer.Option(Path("runs/engine-demo"), help="where the model and engine log go"),
    turns: int = typer.Option(3, help="conversation turns"),
) -> None:
    """Create the tiny model, start vLLM, run a multi-turn conversation, print token ids and logprobs."""
    import asyncio

    from rollyard.engines.demo import run_engine_demo

    for line in asyncio.run(run_engine_demo(workdir, turns)):
        typer.echo(line)
