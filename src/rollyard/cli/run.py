"""``rollyard train``, ``rollyard demo`` and ``rollyard report``: parse, then delegate to rollout."""

from __future__ import annotations

from pathlib import Path

import typer

from rollyard.cli import app


@app.command("train")
def train(
    config: Path | None = typer.Argument(
        None, help="run config (YAML), or a built-in one by name (demo, quick, full)"
    ),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="where the run is written"),
    resume: Path | None = typer.Option(None, "--resume", help="continue the run in this directory"),
    ray: str | None = typer.Option(
        None,
        "--ray",
        help="Ray address for rollout workers, engines and trainer ranks 1.. ('local' starts one)",
    ),
    set_: list[str] = typer.Option([], "--set", help="override a config value: key.path=value"),
) -> None:
    """Agentic RL end to end: engines, gateway, sandboxes, agents, rewards, buffer, trainer."""
    from rollyard.rollout.entry import parse_overrides, run_training

    last = run_training(config, run_dir, resume, ray, parse_overrides(set_))
    typer.echo(" ".join(f"{k}={v}" for k, v in last.items() if not isinstance(v, list)))


@app.command("demo")
def demo(
    seed: int = typer.Option(0, help="seeds the model, the task sets and the run"),
    run_dir: Path | None = typer.Option(None, "--run-dir", help="default runs/demo-seed{SEED}"),
    quick: bool = typer.Option(False, help="the few-minute smoke config instead of the full demo"),
    model: str = typer.Option(
        "tiny", help="tiny (the default example) or smollm2 (a real pretrained model learns to read)"
    ),
    agent: str | None = typer.Option(
        None, help="mini-swe-agent: the unmodified CLI learns to read on SmolLM2 (the CLI-learning demo)"
    ),
    set_: list[str] = typer.Option([], "--set", help="override a config value: key.path=value"),
) -> None:
    """The default example: tiny model, SFT warm start, RL on `stage`, report with plots.
    ``--model smollm2``: SmolLM2-135M-Instruct learns to read before it answers (`readout`).
    ``--agent mini-swe-agent``: the same, through the unmodified mini-SWE-agent CLI."""
    from rollyard.rollout.entry import parse_overrides, run_demo

    out = run_demo(seed, run_dir, quick, parse_overrides(set_), model=model, agent=agent)
    for k, v in out.items():
        typer.echo(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")


@app.command("report")
def report(
    run_dirs: list[Path] = typer.Argument(..., help="one or more run directories"),
    out: Path = typer.Option(Path("runs/compare"), "--out", help="where the comparison of several runs goes"),
) -> None:
    """PNG plots (reward, held-out success, tokens/s, staleness, turns) and summary.md per run;
    with several runs, also their held-out curves on one plot and a start/end/gain table."""
    from rollyard.rollout.report import make_comparison, make_report

    if len(run_dirs) == 1:
        typer.echo(str(make_report(run_dirs[0])))
    else:
        typer.echo(str(make_comparison(run_dirs, out)))
