"""The run directory: what a run leaves behind, and what ``--resume`` and ``report`` read.

::

    RUN_DIR/config.yaml           resolved config
    RUN_DIR/journal.db            the gateway's journal (every turn of every program)
    RUN_DIR/trajectories/step_000001.parquet   the groups trained at that step
    RUN_DIR/checkpoint/           the trainer's last checkpoint (atomic) + the group ledger
    RUN_DIR/weights/v000001/      published weights (the newest few)
    RUN_DIR/metrics.jsonl         one line per step
    RUN_DIR/logs/                 engine logs, run.log
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.rollout.config import Config, dump_config, load_config


@dataclass(frozen=True)
class RunDir:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def checkpoint(self) -> Path:
        return self.root / "checkpoint"

    @property
    def weights(self) -> Path:
        return self.root / "weights"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def trajectories(self) -> Path:
        return self.root / "trajectories"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def trajectory_file(self, step: int) -> Path:
        return self.trajectories / f"step_{step:06d}.parquet"

    def create(self, cfg: Config) -> None:
        """A fresh run dir; refuses one that already holds a run (use --resume)."""
        if self.config.exists():
            raise ConfigError(f"{self.root} already holds a run; continue it with --resume {self.root}")
        for d in (self.root, self.trajectories, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        write_atomic(self.config, dump_config(cfg))

    def load_config(self, overrides: dict[str, Any] | None = None) -> Config:
        if not self.config.is_file():
            raise ConfigError(f"{self.root} is not a run directory (no config.yaml)")
        return load_config(self.config, overrides)

    def has_checkpoint(self) -> bool:
        return (self.checkpoint / "trainer.json").is_file()

    # metrics -------------------------------------------------------------------------------
    def append_metrics(self, row: dict[str, Any]) -> None:
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
        with open(self.metrics, "a") as f:
            f.write(json.dumps(clean, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        if not self.metrics.is_file():
            return []
        rows = []
        for line in self.metrics.read_text().splitlines():
            try:
                rows.append(json.loads(line))
            except ValueError:  # a line cut by a kill
                continue
        return rows

    def truncate_metrics(self, last_step: int) -> None:
        """Forget metric lines of steps after the checkpoint (they will be redone)."""
        keep = [r for r in self.read_metrics() if int(r.get("step", 0)) <= last_step]
        write_atomic(self.metrics, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
