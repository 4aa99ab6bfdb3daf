"""``rollyard sim WORKLOAD --policy NAME ...``: simulate a cluster under the live policies;
``rollyard sim calibrate --engine URL``: measure a real vLLM and write its engine profile."""

from __future__ import annotations

from pathlib import Path

import typer

from rollyard.cli import app
from rollyard.core.errors import ConfigError


def parse_policy(spec: str, **defaults: float):  # type: ignore[no-untyped-def]
    """``NAME`` or ``NAME,part=value,...`` (parts: router, admission, order, tick_s, or an option)."""
    from rollyard.sched.registry import policy_from_spec

    return policy_from_spec(spec, **defaults)


@app.command("sim")
def sim(
    target: str = typer.Argument(
        ..., help="workload YAML or shipped name (swe, math, seer...), calibrate, or bounds"
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
    gateway: bool = typer.Option(False, "--gateway", help="calibrate: the real gateway's CPU per request"),
    workload: str = typer.Option("swe", help="bounds: the workload"),
    profiles: list[str] = typer.Option([], "--bounds-profile", help="bounds: a profile; repeatable"),
    gpus: int = typer.Option(64, help="bounds: GPUs for engines (engines = GPUs / tensor parallelism)"),
    gateway_cost: Path | None = typer.Option(
        None, help="a gateway cost YAML (calibrate --gateway writes one)"
    ),
    gateway_shards: int | None = typer.Option(None, help="override the gateway's shard count"),
    publish_mode: str | None = typer.Option(None, help="override the profile's publish mode: disk or memory"),
    kv_pool: bool = typer.Option(
        False,
        "--kv-pool",
        help="the engines share a KV pool (docs/kv-pool.md)",
    ),
) -> None:
    """Simulate WORKLOAD under each --policy and write a report directory, or calibrate a profile."""
    if target == "calibrate" and gateway:
        from rollyard.bench._gateway_calibrate import calibrate_gateway

        path = out or Path("gateway.yaml")
        cost = calibrate_gateway(path, quick=quick)
        typer.echo(f"wrote {path}: {cost.model_dump()}")
        return
    if target == "calibrate":
        if not engine:
            raise ConfigError("rollyard sim calibrate needs --engine URL (or --gateway)")
        from rollyard.sim.calibrate import calibrate

        path = out or Path(f"{name}.yaml")
        prof = calibrate(
            engine, name=name, path=path, quick=quick, max_num_seqs=max_num_seqs,
            max_batched_tokens=max_batched_tokens,
        )  # fmt: skip
        typer.echo(f"wrote {path}: {prof.model_dump()}")
        return
    from rollyard.sim import Simulation, load_profile, load_workload
    from rollyard.sim.bounds import sized
    from rollyard.sim.profile import load_gateway
    from rollyard.sim.report import write_report

    if target == "bounds":
        _bounds(workload, profiles, policy, gpus, programs, gateway_cost, out)
        return
    w = load_workload(target, engines=engines, programs=programs, seed=seed, divide_tokens=divide_tokens)
    prof = load_profile(profile or w.profile)
    if kv_tokens is not None:
        prof = prof.with_kv_tokens(kv_tokens)
    cost = load_gateway(gateway_cost) if gateway_cost else None
    prof = prof.with_costs(gateway=cost, shards=gateway_shards, publish_mode=publish_mode)
    results = []
    pooled = {"pool_load_tok_s": round(prof.pool_load_tok_s, 1)} if kv_pool else {}
    for spec in policy:
        r = Simulation(w, parse_policy(spec, **pooled), prof, kv_pool=kv_pool).run()
        s = r.summary
        typer.echo(
            f"{r.policy}: output_tok_s={s['output_tok_s']:.1f} program_p50_s={s['program_p50_s']:.1f} "
            f"program_p99_s={s['program_p99_s']:.1f} preemptions={s['preemptions']} pauses={s['pauses']} "
            f"moves={s['moves']} prefill_tokens={s['prefill_tokens']} "
            f"pool_loaded_tokens={s['pool_loaded_tokens']} wall_s={s['wall_s']:.1f}"
        )
        if "trainer_steps" in s:
            typer.echo(
                f"  trainer: steps={s['trainer_steps']} idle={s['trainer_idle']:.3f} "
                f"step_s={s['train_step_s']:.1f} publish_s={s['publish_step_s']:.1f} "
                f"publish_share={s['publish_share']:.3f} staleness_mean={s['staleness_mean']:.2f}"
            )
        if prof.gateway is not None:
            at, need = sized(w, spec, prof)
            typer.echo(
                f"  gateway: shards={s['gateway_shards']} util={s['gateway_util']:.3f} "
                f"util_max_shard={s['gateway_util_max_shard']:.3f} wait_p99_s={s['gateway_wait_p99_s']:.3f}"
            )
            typer.echo(
                f"  gateway_shards_needed={need} (utilisation <= 0.7: at {need} shards "
                f"util={at.summary['gateway_util']:.3f}, output_tok_s={at.summary['output_tok_s']:.1f})"
            )
        results.append(r)
    path = write_report(out or Path("sim-runs") / w.name, results)
    typer.echo(f"report: {path}")


def _bounds(
    workload: str, profiles: list[str], policy: list[str], gpus: int, programs: int | None,
    gateway_cost: Path | None, out: Path | None,
) -> None:  # fmt: skip
    """``rollyard sim bounds``: what bounds a run on GPUS, per profile, policy and publish mode."""
    from rollyard.sim import load_profile, load_workload, profile_names
    from rollyard.sim.bounds import bounds, table
    from rollyard.sim.profile import load_gateway, write_text

    w = load_workload(workload, programs=programs)
    names = profiles or [n for n in profile_names() if load_profile(n).trainer is not None]
    names.sort(key=lambda n: getattr(load_profile(n).trainer, "params", 0.0))  # smallest model first
    cost = load_gateway(gateway_cost) if gateway_cost else None
    profs = [load_profile(n).with_costs(gateway=cost) for n in names]
    fits = [p for p in profs if p.max_model_len >= w.max_context]
    for p in profs:
        if p not in fits:
            typer.echo(f"{p.name}: max_model_len {p.max_model_len} < the workload's {w.max_context}: skipped")
    typer.echo(table([], head=True))
    text = table(bounds(w, fits, policy, gpus, done=lambda row: typer.echo(table([row], head=False))))
    if out is not None:
        write_text(out, text + "\n")
        typer.echo(f"wrote {out}")
