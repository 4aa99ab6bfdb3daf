"""``rollyard tasks generate|validate``: parse arguments, delegate to ``rollyard.tasks``."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rollyard.cli import app
from rollyard.core.errors import ConfigError
from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks.validate import ValidationReport

tasks_app = typer.Typer(help="Task families, generation and validation.", no_args_is_help=True)
app.add_typer(tasks_app, name="tasks")


def _provider(name: str) -> SandboxProvider:
    if name == "bwrap":
        from rollyard.sandbox.bwrap import BwrapProvider

        return BwrapProvider()
    if name == "local":
        from rollyard.sandbox.local import LocalProvider

        return LocalProvider(unsafe=True)
    raise ConfigError(f"unknown sandbox provider {name!r}; use 'bwrap' or 'local' (unsafe)")


@tasks_app.command("generate")
def generate_cmd(
    family: str = typer.Argument(..., help="task family: lookup, stage, bugfix or sums"),
    out: Path = typer.Argument(..., help="directory to write task directories into"),
    n: int = typer.Option(10, "--n", help="number of tasks"),
    seed: int = typer.Option(0, "--seed", help="the same seed gives the same tasks"),
    overwrite: bool = typer.Option(False, help="replace task directories that already exist"),
) -> None:
    """Write N seeded instances of a task family."""
    from rollyard.tasks import generate

    paths = generate(family, out, n, seed, overwrite=overwrite)
    typer.echo(f"wrote {len(paths)} {family} tasks to {out}")


@tasks_app.command("validate")
def validate_cmd(
    source: Path = typer.Argument(..., help="a task dir, a dir of task dirs, or a list file"),
    out: Path = typer.Option(Path("validation"), help="report, journal and kept.txt go here"),
    concurrency: int = typer.Option(4, help="tasks validated at once"),
    sandbox: str = typer.Option("bwrap", help="sandbox provider: bwrap, or local (no isolation)"),
    copy: bool = typer.Option(False, help="also copy kept tasks into OUT/tasks"),
    judge_url: str | None = typer.Option(None, help="OpenAI-compatible base URL for the judge panel"),
    judge_model: list[str] = typer.Option([], help="judge model (repeat for several)"),
    judges: int = typer.Option(3, help="number of judges (k)"),
    judge_key_env: str = typer.Option("OPENAI_API_KEY", help="environment variable holding the key"),
) -> None:
    """Keep tasks whose golden passes, whose no-op fails and (optionally) that judges accept."""
    from rollyard.tasks import JudgeConfig, JudgePanel, load_tasks, validate_tasks

    tasks = load_tasks(source)
    panel = None
    if judge_url is not None:
        if not judge_model:
            raise ConfigError("--judge-url needs at least one --judge-model")
        key = os.environ.get(judge_key_env, "EMPTY")
        panel = JudgePanel(JudgeConfig(base_url=judge_url, api_key=key, models=judge_model, k=judges))
    provider = _provider(sandbox)
    console = Console(stderr=True)
    columns = (TextColumn("validating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        bar = progress.add_task("tasks", total=len(tasks))

        def done(_verdict: object, _resumed: bool) -> None:
            progress.advance(bar)

        async def run() -> ValidationReport:
            try:
                return await validate_tasks(
                    tasks,
                    provider,
                    out,
                    concurrency=concurrency,
                    panel=panel,
                    copy_kept=copy,
                    on_done=done,
                )
            finally:
                if panel is not None:
                    await panel.aclose()

        report = asyncio.run(run())
    typer.echo(report.summary())
    typer.echo(f"report: {out / 'report.json'}  kept list: {out / 'kept.txt'}")
