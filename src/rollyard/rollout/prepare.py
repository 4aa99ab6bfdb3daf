"""Before the loop: the model directory and the task sets a run needs, made or checked.

Generated task sets live in the run dir (``tasks/train``, ``tasks/eval``), so a resumed run sees
the same tasks; validation (golden passes, no-op fails) drops bad instances up front and a set
with nothing left is a clear error.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rollyard.core.errors import ConfigError, TaskError
from rollyard.engines.pretrained import init_pretrained
from rollyard.engines.tiny_model import check_model_dir, create_model
from rollyard.rollout.config import Config, TaskSetConfig
from rollyard.sandbox.base import SandboxProvider
from rollyard.tasks import generate, load_tasks
from rollyard.tasks.model import Task
from rollyard.tasks.validate import validate_tasks

log = logging.getLogger(__name__)


def ensure_model(cfg: Config) -> Path:
    """The policy's starting directory: created (a seeded random model, or a converted pretrained
    one) when asked and missing."""
    path = cfg.model.path
    if not (path / "config.json").is_file() and cfg.model.create:
        if cfg.model.pretrained is not None:
            init_pretrained(cfg.model.pretrained, path, overwrite=True)
        else:
            create_model(path, seed=cfg.model.seed, size=cfg.model.size, overwrite=True)
    try:
        return check_model_dir(path)
    except ConfigError as e:
        raise ConfigError(f"model.path: {e.message}") from None


def _task_set(ts: TaskSetConfig, where: Path) -> list[Task]:
    if ts.path is not None:
        return load_tasks(ts.path)
    assert ts.family is not None
    if not where.is_dir() or not any(where.iterdir()):
        generate(ts.family, where, ts.n, seed=ts.seed, overwrite=True)
    return load_tasks(where)


async def _validated(tasks: list[Task], provider: SandboxProvider, out: Path, what: str) -> list[Task]:
    report = await validate_tasks(tasks, provider, out)
    kept = {v.task_id for v in report.verdicts if v.keep}
    log.info("%s tasks: %s", what, report.summary())
    if not kept:
        raise TaskError(f"no {what} task passed validation: {report.summary()} (details in {out})")
    return [t for t in tasks if t.id in kept]


async def ensure_tasks(
    cfg: Config, run_dir: Path, provider: SandboxProvider
) -> tuple[list[Task], list[Task]]:
    """(train, held-out) tasks; held-out is empty when the config has no eval set."""
    train = _task_set(cfg.tasks.train, run_dir / "tasks" / "train")
    held = _task_set(cfg.tasks.eval, run_dir / "tasks" / "eval") if cfg.tasks.eval else []
    overlap = {t.id for t in train} & {t.id for t in held}
    if overlap:
        raise ConfigError(f"tasks.eval shares {len(overlap)} task ids with tasks.train; use another seed")
    if cfg.tasks.validate_tasks:
        train = await _validated(train, provider, run_dir / "tasks" / "validation-train", "train")
        if held:
            held = await _validated(held, provider, run_dir / "tasks" / "validation-eval", "eval")
    return train, held
