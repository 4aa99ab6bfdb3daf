"""``rollyard sim WORKLOAD --policy NAME ...``: simulate a cluster under the live policies;
``rollyard sim calibrate --engine URL``: measure a real vLLM and write its engine profile."""

from __future__ import annotations

from pathlib import Path

import typer

from rollyard.cli import app
from rollyard.core.errors import ConfigError


def parse_policy(spec: str):  # type: ignore[no-untyped-def]
    """``NAME`` or ``NAME,part=value,...`` (parts: router, admission, order, tick_s, or an option)."""
    from rollyard.sched.registry import policy_from_spec

    return policy_from_spec(spec)


@app.command("sim")
def sim(
    target: str = typer.Argument(
        ..., help="workload YAML or shipped name (swe, math, seer...), or calibrate"
    ),
    policy: list[str] = typer.Option(["fifo"], "--policy", "-p", help="NAME or NAME,order=X; repeatable"),
    engines: int | None = typer.Option(None, help="override the workload's engine count"),
    programs: int | None = typer.Option(None, help="override the workload's program count"),
    profile: str | None = typer.Option(None, help="engine profile: name or YAML (default: the workload's)"),
    seed: int | None = typer.Option(None, help="override the workload's seed"),
    divide_tokens: int | None = typer.Option(None, help="divided rollout chunk (gateway --divide-tokens)"),
    kv_tokens: int | None = typer.Option(None, help="override the profile's KV cache size, in tokens"),
    out: Path | None = typer.Option(None, help="report directory (default: sim-runs/WORKLOAD)"),
    engine: str | None = typer.Option(None, help="calibrate: the vLLM base URL, e.g. http://127.0.0.1:8000"),
    name: str = typer.Option("calibrated", help="calibrate: the profile's name"),
    quick: bool = typer.Option(False, help="calibrate: fewer points"),
    max_num_seqs: int = typer.Option(128, help="calibrate: the engine's --max-num-seqs (vLLM CPU default)"),
    max_batched_tokens: int = typer.Option(2048, help="calibrate: the engine's --max-num-batched-tokens"),
) -> None:
    """Simulate WORKLOAD under each --policy and write a report directory, or calibrate a profile."""
    if target == "calibrate":
        if not engine:
            raise ConfigError("rollyard sim calibrate needs --engine URL")
        from rollyard.sim.calibrate import calibrate

        path = out or Path(f"{name}.yaml")
        prof = calibrate(
            engine, name=name, path=path, quick=quick, max_num_seqs=max_num_seqs,
            max_batched_tokens=max_batched_tokens,
        )  # fmt: skip
        typer.echo(f"wrote {path}: {prof.model_dump()}")
        return
    from rollyard.sim import Simulation, load_profile, load_workload
    from rollyard.sim.report import write_report

    w = load_workload(target, engines=engines, programs=programs, seed=seed, divide_tokens=divide_tokens)
    prof = load_profile(profile or w.profile)
    if kv_tokens is not None:
        prof = prof.with_kv_tokens(kv_tokens)
    results = []
    for spec in policy:
        r = Simulation(w, parse_policy(spec), prof).run()
        s = r.summary
        typer.echo(
            f"{r.policy}: output_tok_s={s['output_tok_s']:.1f} program_p50_s={s['program_p50_s']:.1f} "
            f"program_p99_s={s['program_p99_s']:.1f} preemptions={s['preemptions']} pauses={s['pauses']} "
            f"wall_s={s['wall_s']:.1f}"
        )
        results.append(r)
    path = write_report(out or Path("sim-runs") / w.name, results)
    typer.echo(f"report: {path}")
