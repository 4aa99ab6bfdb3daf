"""A whole run, in order: tasks and model -> (SFT warm start) -> trainer -> engines -> gateway
-> sandbox pool -> rollout workers -> the loop; teardown in reverse on success, error or Ctrl-C.

``--resume`` reloads the config written to the run dir, the trainer checkpoint (weights,
optimizer, RNG) and its group ledger, and starts the engines on the weights that checkpoint
published, so the policy version continues where it stopped.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.rollout.collect import LocalRunner, ProgramRunner
from rollyard.rollout.config import Config
from rollyard.rollout.environment import ProgramEnvironment
from rollyard.rollout.ledger import GroupLedger
from rollyard.rollout.loop import LoopState, ProgressFn, TrainingLoop
from rollyard.rollout.prepare import ensure_model, ensure_tasks
from rollyard.rollout.ray_runner import ray_session
from rollyard.rollout.rundir import RunDir
from rollyard.rollout.services import Services, make_provider, open_services
from rollyard.rollout.sft import warm_start
from rollyard.rollout.sft_blackbox import cli_warm_start
from rollyard.rollout.sft_scripted import scripted_warm_start
from rollyard.tasks.model import Task

log = logging.getLogger(__name__)


def load_policy(model_dir: Path) -> Any:
    """Any causal LM transformers loads, in fp32 on the CPU; the trainer moves it to its rank's
    device (a module-level function: spawned trainer ranks call it too)."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def build_trainer(cfg: Config, model_dir: Path) -> Any:
    """One trainer, or ``trainer.world_size`` FSDP2 ranks behind the same face (also one rank in
    a process group for bf16, which runs through FSDP2's mixed precision)."""
    import torch

    from rollyard.train.trainer import Trainer

    torch.set_num_threads(cfg.trainer.threads)
    torch.manual_seed(cfg.run.seed)
    # The trainer's distribution is the sampled one: logits / run.temperature (engines record
    # logprobs of that same distribution, ``--logprobs-mode processed_logprobs``).
    train_cfg = cfg.trainer.train_config().model_copy(update={"temperature": max(cfg.run.temperature, 1e-3)})
    if cfg.trainer.world_size > 1 or cfg.trainer.dtype == "bf16":
        from rollyard.train.ranks import RankGroup, RayPlacement

        t = cfg.trainer
        ray = RayPlacement(t.cpus_per_rank, t.ray_strategy) if cfg.ranks_on_ray else None
        make = functools.partial(load_policy, model_dir)
        return RankGroup(make, train_cfg, t.world_size, ray, collective_timeout_s=t.collective_timeout_s)
    return Trainer(load_policy(model_dir), train_cfg)


@contextlib.asynccontextmanager
async def make_runner(cfg: Config, svc: Services, run: RunDir) -> AsyncIterator[ProgramRunner]:
    """Local agents, or Ray rollout workers when ``ray.address`` is set."""
    if cfg.ray.address is None:
        env = ProgramEnvironment(
            svc.provider,
            monitor_tests=cfg.sandbox.monitor_tests,
            perturb_prob=cfg.tasks.perturb.prob,
            catalogue=list(cfg.tasks.perturb.kinds),
            seed=cfg.run.seed,
        )
        yield LocalRunner(svc, cfg.agent.timeout_s, env)
        return
    from rollyard.rollout.ray_runner import RayRunner

    runner = RayRunner(cfg)
    try:
        yield runner
    finally:
        runner.close()


def weights_to_keep(cfg: Config) -> int:
    """Weight versions kept on disk: never fewer than reach back to the last checkpoint.

    Resuming loads the weights of the checkpoint's version. With a checkpoint every ``c`` steps,
    up to ``c`` newer versions can be published before the next one is saved (the last of them
    just before an interrupt), so ``c + 1`` versions must survive the pruning."""
    return max(2, cfg.run.keep_weights, cfg.run.checkpoint_every + 1)


def _resume_state(run: RunDir, trainer: Any) -> LoopState:
    extra = trainer.load(run.checkpoint)
    state = LoopState(
        step=int(extra["step"]),
        version=int(extra["version"]),
        ledger=GroupLedger.from_state(extra["ledger"]),
        draft_head=extra.get("draft_head"),
    )
    run.truncate_metrics(state.step)
    log.info("resumed run=%s step=%d version=%d", run.root, state.step, state.version)
    return state


async def train(
    cfg: Config, run: RunDir, *, resume: bool = False, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Run (or continue) training; returns the last metrics row."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no "Writing model shards" bar per publish: our progress only
    say = progress or (lambda _row: None)
    if cfg.engine.drafting.method == "eagle":
        from rollyard.train.draft_online import check_eagle_publish

        check_eagle_publish(cfg.engine.drafting, cfg.publish.mode)
    if not resume:
        run.create(cfg)
    provider = make_provider(cfg, run.root)
    say(
        {
            "event": "phase",
            "phase": "tasks",
            "detail": "generating and validating" if cfg.tasks.validate_tasks else "generating",
        }
    )
    train_tasks, held_out = await ensure_tasks(cfg, run.root, provider)
    start = ensure_model(cfg)
    if cfg.engine.drafting.method == "eagle":  # a head that cannot fit fails before the warm start
        from rollyard.train.draft_online import check_eagle_policy

        check_eagle_policy(cfg.engine.drafting, start)
    if cfg.sft.enabled:
        blackbox = cfg.agent.kind == "blackbox"
        what = (
            f"{cfg.sft.demos} {cfg.agent.profile} programs"
            + (" against the scripted engine" if cfg.sft.kind == "scripted" else "' prompts")
            if blackbox
            else f"{cfg.sft.demos} demonstrations"
        )
        say({"event": "phase", "phase": "sft", "detail": f"{what}, {cfg.sft.epochs} epochs"})
        if blackbox:  # the CLI's own prompts, answered with a finished turn or by the script
            with ray_session(cfg, run.root):  # its engines may be Ray actors, on the run's cluster
                cli_start = scripted_warm_start if cfg.sft.kind == "scripted" else cli_warm_start
                start = await cli_start(train_tasks, start, run.root, cfg)
        else:
            start = await warm_start(train_tasks, provider, start, run.root, cfg)
    if cfg.engine.drafting.method == "eagle":  # head: auto is made (or found) before engines start
        from rollyard.train.draft_online import prepare_head

        say({"event": "phase", "phase": "draft_head", "detail": f"eagle head {cfg.engine.drafting.head}"})
        demos = run.root / "sft" / "demos.jsonl"
        cfg.engine.drafting = prepare_head(
            cfg.engine.drafting, start, demos if demos.is_file() else None, cfg.run.seed
        )
    where = ", ranks 1.. as Ray actors in one placement group" if cfg.ranks_on_ray else ""
    say({"event": "phase", "phase": "trainer", "detail": f"{cfg.trainer.world_size} rank(s){where}"})
    with ray_session(cfg, run.root):  # trainer ranks, engines and rollout workers may be its actors
        trainer = build_trainer(cfg, start)
        try:
            return await _train(
                cfg, run, trainer, start, train_tasks, held_out, resume=resume, progress=progress
            )
        finally:
            if hasattr(trainer, "close"):
                trainer.close()


async def _train(
    cfg: Config,
    run: RunDir,
    trainer: Any,
    start: Path,
    train_tasks: list[Task],
    held_out: list[Task],
    *,
    resume: bool,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    weights, state = start, LoopState(step=0, version=0, ledger=GroupLedger())
    memory = cfg.publish.mode == "memory"
    if resume and run.has_checkpoint():
        state = _resume_state(run, trainer)
        if state.version > 0 and not memory:
            weights = run.weights / f"v{state.version:06d}"
            if not (weights / "config.json").is_file():
                raise ConfigError(f"checkpoint is at version {state.version} but {weights} is missing")
            if cfg.engine.drafting.method == "eagle":  # the engines start with that version's head
                from rollyard.train.draft_online import served_head

                cfg.engine.drafting = served_head(cfg.engine.drafting, weights)
    elif resume:
        run.truncate_metrics(0)
    if state.step >= cfg.run.steps:
        log.info("run %s already finished %d steps", run.root, state.step)
        return run.read_metrics()[-1] if run.read_metrics() else {}
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(start)
    if progress is not None:
        where = "attaching" if cfg.engine.urls else f"starting {cfg.engine.count} vLLM engine(s)"
        progress({"event": "phase", "phase": "engines", "detail": f"{where}, gateway, sandboxes"})
    # Memory mode writes no weights: engines start (and restart) on the starting model and are
    # then given the trainer's weights; a resumed run's are sent as its checkpoint's version.
    served = 0 if memory else state.version
    return await _serve_and_loop(
        cfg, run, trainer, tokenizer, weights, served, train_tasks, held_out, state, progress
    )


async def _serve_and_loop(
    cfg: Config,
    run: RunDir,
    trainer: Any,
    tokenizer: Any,
    weights: Path,
    served: int,
    train_tasks: list[Task],
    held_out: list[Task],
    state: LoopState,
    progress: ProgressFn | None,
) -> dict[str, Any]:
    """Engines, gateway and sandboxes up; the publisher joined to the engines; the loop to the end."""
    from rollyard.train.draft_online import online_head
    from rollyard.train.publish import WeightPublisher

    async with open_services(cfg, run.root, weights, served) as svc:
        p = cfg.publish
        publisher = WeightPublisher(
            svc.fleet.backends,
            run.weights,
            base_path=weights,
            base_version=served,
            keep=weights_to_keep(cfg),
            tokenizer=tokenizer,
            mode=p.mode,
            bucket_mb=p.bucket_mb,
            host=p.host,
            timeout_s=p.timeout_s,
        )
        await publisher.start()
        # engine.drafting eagle, online; a resumed run's head as its checkpoint saved it
        head = online_head(cfg.engine.drafting, trainer, publisher, resumed=state.draft_head)
        if p.mode == "memory":
            svc.fleet.catch_up = publisher.catch_up
        if served != state.version:
            await publisher.publish(trainer.model, state.version)
        async with make_runner(cfg, svc, run) as runner:
            loop = TrainingLoop(
                cfg, run, svc, runner, trainer, publisher, train_tasks, held_out, state, progress=progress
            )
            loop.draft_head = head
            return await loop.run()
