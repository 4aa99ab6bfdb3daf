"""``rollyard plan CONFIG``: per-rank GPU memory of a run's trainer, from a meta-device model."""

from __future__ import annotations

from pathlib import Path

import typer

from rollyard.cli import app


@app.command("plan")
def plan(
    config: Path = typer.Argument(..., help="a rollyard train YAML (its trainer: and model: sections)"),
    model: str | None = typer.Option(
        None,
        help="qwen2.5-7b, qwen2.5-32b, smollm2-135m, a rollyard size, or a config.json path "
        "(default: the config's model)",
    ),
    world_size: int | None = typer.Option(
        None, help="trainer ranks, one GPU each (default: trainer.world_size)"
    ),
    gpu_mem_gb: float = typer.Option(80.0, help="memory of one GPU, GB"),
    dtype: str | None = typer.Option(None, help="fp32 or bf16 (default: trainer.dtype, else fp32)"),
    parallel: str | None = typer.Option(None, help="fsdp2 or replicate (default: trainer.parallel.kind)"),
    activation_checkpointing: bool | None = typer.Option(
        None, "--activation-checkpointing/--no-activation-checkpointing", help="default: the trainer's"
    ),
    token_budget: int | None = typer.Option(
        None, help="tokens per micro-batch (default: trainer.token_budget)"
    ),
    reserve_gb: float = typer.Option(2.0, help="CUDA context, NCCL buffers and allocator slack, GB"),
) -> None:
    """Print per-rank bytes (parameters, gradients, optimizer, activations, logits) and headroom."""
    from rollyard.rollout.config import load_config
    from rollyard.train.plan import model_config, plan_memory, setup_from_trainer

    cfg = load_config(config)
    name = model or _config_model(cfg.model)
    setup = setup_from_trainer(
        cfg.trainer,
        world_size=world_size,
        gpu_mem_gb=gpu_mem_gb,
        dtype=dtype,
        parallel=parallel,
        activation_checkpointing=activation_checkpointing,
        token_budget=token_budget,
        reserve_gb=reserve_gb,
    )
    typer.echo(plan_memory(model_config(name), setup, name=name).render())


def _config_model(model: object) -> str:
    """The run's own policy: its saved config.json if present, else what ``create`` would build."""
    path = Path(getattr(model, "path", ""))
    if (path / "config.json").is_file():
        return str(path)
    return getattr(model, "pretrained", None) or str(getattr(model, "size", "tiny"))
