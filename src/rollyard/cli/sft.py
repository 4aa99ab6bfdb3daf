"""``rollyard sft``: supervised warm start on demonstrations (the trainer's own code path)."""

from __future__ import annotations

from pathlib import Path

import typer

from rollyard.cli import app


@app.command("sft")
def sft(
    model_dir: Path = typer.Argument(..., help="Hugging Face model directory to start from"),
    data: Path = typer.Argument(..., help='JSONL of {"prompt_ids", "completion_ids"} or Sample records'),
    out_dir: Path = typer.Option(..., "--out", help="where the versioned weight dir v<steps> is written"),
    steps: int = typer.Option(100, help="optimizer steps"),
    batch_size: int = typer.Option(8, help="demonstrations per step"),
    lr: float = typer.Option(1e-4, help="AdamW learning rate"),
    seed: int = typer.Option(0, help="shuffling and init seed"),
    token_budget: int = typer.Option(8192, help="tokens per micro-batch (gradient accumulation)"),
) -> None:
    """Fine-tune on demonstrations with cross-entropy on completion tokens; prints the weight dir."""
    from rollyard.train.sft import run_sft

    result = run_sft(
        model_dir,
        data,
        out_dir,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        token_budget=token_budget,
    )
    losses = result["losses"]
    typer.echo(
        f"sft: steps={result['steps']} skipped={result['skipped']} loss={losses[0]:.4f}->{losses[-1]:.4f}"
    )
    typer.echo(result["weights"])
