"""Publish trained weights to every engine as one new policy version, or to none.

A step's weights are written as a versioned safetensors dir (``save_weights`` refuses NaN),
then each engine reloads from that path. If an engine still refuses after retries, the
engines that already switched are rolled back to the previous version and the step fails
loudly, so every engine (and so every recorded turn) agrees on which version is live.
Old version dirs beyond ``keep`` are deleted.
"""

from __future__ import annotations

import asyncio
import logging
import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollyard.core.errors import RollyardError, TrainError
from rollyard.engines.base import Backend
from rollyard.train.checkpoint import save_weights

log = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^v(\d{6,})$")


class WeightPublisher:
    def __init__(
        self,
        engines: Sequence[Backend],
        root: str | Path,
        *,
        base_path: str | Path,
        base_version: int = 0,
        keep: int = 2,
        retries: int = 3,
        retry_delay_s: float = 1.0,
        tokenizer: Any = None,
    ) -> None:
        if keep < 1:
            raise TrainError("keep at least the live version")
        self.engines = list(engines)
        self.root = Path(root)
        self.keep = keep
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.tokenizer = tokenizer
        self.version = base_version
        self.path = Path(base_path)
        self.published = 0

    async def _load(self, engine: Backend, path: Path, version: int) -> None:
        last: Exception | None = None
        for attempt in range(1, self.retries + 1):
            try:
                await engine.load_weights(str(path), version)
                return
            except RollyardError as e:
                last = e
                log.warning(
                    "engine=%s refused weights v%d (attempt %d): %s", engine.name, version, attempt, e
                )
                await asyncio.sleep(self.retry_delay_s * attempt)
        raise TrainError(f"engine {engine.name} refused weights version {version}: {last}")

    async def publish(self, model: Any, version: int) -> Path:
        """Make ``version`` live on every engine; on failure, leave the previous one live."""
        if version <= self.version:
            raise TrainError(f"version {version} is not newer than the live version {self.version}")
        path = save_weights(model, self.root, version, tokenizer=self.tokenizer)
        switched: list[Backend] = []
        try:
            for engine in self.engines:
                await self._load(engine, path, version)
                switched.append(engine)
        except TrainError:
            for engine in switched:  # roll back so every engine serves the same version
                try:
                    await engine.load_weights(str(self.path), self.version)
                except RollyardError as e:
                    log.error("engine=%s could not roll back to v%d: %s", engine.name, self.version, e)
            shutil.rmtree(path, ignore_errors=True)
            raise
        self.version, self.path = version, path
        self.published += 1
        self._cleanup()
        log.info("published weights version=%d path=%s engines=%d", version, path, len(self.engines))
        return path

    def _cleanup(self) -> None:
        versions = sorted(
            (int(m.group(1)), p)
            for p in self.root.iterdir()
            if p.is_dir() and (m := _VERSION_DIR.match(p.name))
        )
        for v, p in versions[: max(0, len(versions) - self.keep)]:
            if p != self.path:
                shutil.rmtree(p, ignore_errors=True)
                log.debug("removed old weights version=%d", v)
