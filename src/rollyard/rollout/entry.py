"""What the ``train``, ``demo`` and ``report`` commands call: pick the config and run dir, log to
``RUN_DIR/logs/run.log``, show progress, run, report."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.rollout.config import Config, builtin_config, load_config, resolve_paths
from rollyard.rollout.interrupt import InterruptGuard
from rollyard.rollout.orchestrator import train
from rollyard.rollout.progress import LiveProgress
from rollyard.rollout.report import make_report, summarize
from rollyard.rollout.rundir import RunDir


@contextlib.contextmanager
def run_log(run_dir: Path) -> Iterator[None]:
    """Everything rollyard logs at INFO goes to the run's log file while the run lasts."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(run_dir / "logs" / "run.log")
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    console = logging.StreamHandler()  # the terminal keeps showing warnings only
    console.setLevel(logging.WARNING)
    root = logging.getLogger("rollyard")
    old, old_propagate = root.level, root.propagate
    root.addHandler(handler)
    root.addHandler(console)
    root.propagate = False
    root.setLevel(logging.INFO)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.removeHandler(console)
        root.setLevel(old)
        root.propagate = old_propagate
        handler.close()


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """``key.path=value`` pairs; values are read as YAML scalars (numbers, booleans, null)."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set expects key.path=value, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out


# Ctrl-C's orderly teardown (programs, gateway, sandboxes, engines) normally takes seconds; past
# this (or at a second Ctrl-C) engines are SIGKILLed and the process leaves at once.
TEARDOWN_GRACE_S = 90.0


def _execute(cfg: Config, run: RunDir, resume: bool) -> dict[str, Any]:
    # SIGINT and SIGTERM both cancel the run; see rollyard.rollout.interrupt.
    guard = InterruptGuard(TEARDOWN_GRACE_S)
    with run_log(run.root), LiveProgress(cfg.run.steps) as progress:
        return guard.run(train(cfg, run, resume=resume, progress=progress if cfg.run.progress else None))


# What a resumed run may change: where and how long it trains, not what (the checkpoint is
# sharded by parameter name, so it loads at any world size).
RESUME_KEYS = {
    "run.steps",
    "run.progress",
    "trainer.world_size",
    "trainer.placement",
    "trainer.cpus_per_rank",
    "trainer.ray_strategy",
    "trainer.collective_timeout_s",
    "trainer.parallel.kind",
    "trainer.activation_checkpointing",
    "trainer.threads",
}


def _not_a_torchrun_rank() -> None:
    """A run is one process that starts its own trainer ranks (``trainer.world_size``,
    ``trainer.placement``); under torchrun every rank would run a whole run (its own engines,
    gateway and buffer), so that is refused before anything starts."""
    world = os.environ.get("WORLD_SIZE", "")
    if world.isdigit() and int(world) > 1 and "RANK" in os.environ:
        raise ConfigError(
            f"rollyard train is running as rank {os.environ['RANK']} of WORLD_SIZE={world} (torchrun?): "
            "start it once and set trainer.world_size (and trainer.placement: ray with --ray for "
            "ranks on other nodes); it starts the ranks itself. If these variables are left over "
            "from another job, run it without them: env -u RANK -u WORLD_SIZE rollyard train ..."
        )


def run_training(
    config: Path | None, run_dir: Path | None, resume: Path | None, ray: str | None, overrides: dict[str, Any]
) -> dict[str, Any]:
    """``rollyard train``: a new run from CONFIG, or ``--resume RUN_DIR`` with its saved config."""
    _not_a_torchrun_rank()
    if resume is not None:
        run = RunDir(resume)
        other = sorted(set(overrides) - RESUME_KEYS)
        if other or ray:
            raise ConfigError(
                "--resume continues the saved config; --set may change only "
                f"{', '.join(sorted(RESUME_KEYS))} (not {', '.join(other) or '--ray'})"
            )
        return _execute(run.load_config(overrides), run, True)
    if config is None:
        raise ConfigError("give a CONFIG.yaml (or --resume RUN_DIR)")
    if ray:
        overrides = {**overrides, "ray.address": ray}
    run = RunDir(run_dir or Path("runs") / f"{config.stem}-{time.strftime('%Y%m%d-%H%M%S')}")
    if not config.suffix and not config.exists():  # a built-in config by name: ``full``, ``quick``
        cfg = resolve_paths(builtin_config(str(config), overrides), run.root.resolve())
    else:
        cfg = load_config(config, overrides)
    return _execute(cfg, run, False)


DEMO_MODELS = {"tiny": "demo", "smollm2": "demo-smollm2"}  # rollyard demo --model NAME -> built-in config
DEMO_AGENTS = {"mini-swe-agent": "demo-mini-swe-agent"}  # rollyard demo --agent CLI (on SmolLM2)


def run_demo(
    seed: int,
    run_dir: Path | None,
    quick: bool,
    overrides: dict[str, Any],
    *,
    model: str = "tiny",
    agent: str | None = None,
) -> dict[str, Any]:
    """``rollyard demo``: the embedded config with every seed set from ``seed``; then the report.
    ``agent``: the CLI-learning demo of that black-box CLI (installed first if it is not)."""
    if model not in DEMO_MODELS:
        raise ConfigError(f"unknown demo model {model!r}; choose one of: {', '.join(DEMO_MODELS)}")
    if agent is not None and agent not in DEMO_AGENTS:
        raise ConfigError(f"no CLI-learning demo for {agent!r}; choose one of: {', '.join(DEMO_AGENTS)}")
    if quick and (model != "tiny" or agent is not None):
        raise ConfigError("--quick is the tiny model's smoke config; it has no --model or --agent variant")
    if agent is not None:
        from rollyard.agents.install import install, require_reachable_cache

        require_reachable_cache()  # fail now, not after the install and the engine's start
        install(agent)  # once; cached
    name = "quick" if quick else DEMO_AGENTS[agent] if agent is not None else DEMO_MODELS[model]
    seeded = {"run.seed": seed, "model.seed": seed, "tasks.train.seed": 1000 + seed}
    if not quick:
        seeded["tasks.eval.seed"] = 2000 + seed
    root = (run_dir or Path("runs") / f"{name}-seed{seed}").resolve()
    run = RunDir(root)
    if run.config.exists():
        cfg = run.load_config()
        resume = True
    else:
        cfg = resolve_paths(builtin_config(name, {**seeded, **overrides}), root)
        resume = False
    t0 = time.monotonic()
    last = _execute(cfg, run, resume)
    summary_path = make_report(root)
    return {
        "run_dir": str(root),
        "summary": str(summary_path),
        **summarize(run.read_metrics()),
        **{k: last[k] for k in ("step",) if k in last},
        "wall_s": time.monotonic() - t0,  # this invocation, start-up to report
    }
