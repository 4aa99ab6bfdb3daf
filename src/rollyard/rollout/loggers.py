"""Experiment trackers: every metrics row a run writes also goes to TensorBoard and W&B.

``RUN_DIR/metrics.jsonl`` is always written (``--resume`` and ``rollyard report`` read it);
``run.loggers`` adds trackers. TensorBoard event files go to ``RUN_DIR/tensorboard``; W&B runs
offline unless ``WANDB_MODE`` says otherwise, into ``RUN_DIR/wandb`` (``wandb sync`` uploads
it later). Only numeric values are logged as scalars; lists and strings stay in the JSONL.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from rollyard.core.errors import ConfigError

log = logging.getLogger(__name__)

LoggerKind = Literal["jsonl", "tensorboard", "wandb"]


class MetricLogger(Protocol):
    def log(self, row: dict[str, Any], step: int) -> None: ...

    def close(self) -> None: ...


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The row's finite numbers (bools as 0/1); everything else is left to the JSONL."""
    return {k: float(v) for k, v in row.items() if isinstance(v, int | float) and math.isfinite(v)}


class TensorBoardLogger:
    def __init__(self, root: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as e:  # the `track` extra
            raise ConfigError("run.loggers: tensorboard needs the tensorboard package") from e
        self.dir = root / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.dir))

    def log(self, row: dict[str, Any], step: int) -> None:
        for k, v in scalars(row).items():
            self.writer.add_scalar(k, v, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbLogger:
    def __init__(self, root: Path, name: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError as e:
            raise ConfigError("run.loggers: wandb needs the wandb package") from e
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "rollyard"),
            name=name,
            dir=str(root),
            config=config,
            mode=os.environ.get("WANDB_MODE", "offline"),  # type: ignore[arg-type]
            resume="allow",
            id=name,
        )

    def log(self, row: dict[str, Any], step: int) -> None:
        self.run.log(scalars(row), step=step)

    def close(self) -> None:
        self.run.finish()


class Trackers:
    """The run's extra loggers, fed each metrics row after it is in the JSONL."""

    def __init__(self, loggers: Sequence[MetricLogger]) -> None:
        self.loggers = list(loggers)

    def log(self, row: dict[str, Any]) -> None:
        step = int(row.get("step", 0))
        for lg in self.loggers:
            try:
                lg.log(row, step)
            except Exception:  # a tracker must never stop training: the JSONL has the row
                log.exception("metrics logger %s failed at step %d", type(lg).__name__, step)

    def close(self) -> None:
        for lg in self.loggers:
            try:
                lg.close()
            except Exception:
                log.exception("metrics logger %s failed to close", type(lg).__name__)


def open_trackers(kinds: Sequence[LoggerKind], root: Path, config: dict[str, Any]) -> Trackers:
    """``jsonl`` is the run's own record (always written); the others are opened here."""
    loggers: list[MetricLogger] = []
    if "tensorboard" in kinds:
        loggers.append(TensorBoardLogger(root))
    if "wandb" in kinds:
        loggers.append(WandbLogger(root, root.name, config))
    return Trackers(loggers)
