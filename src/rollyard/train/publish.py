"""Publish trained weights to every engine as one new policy version, behind a version fence.

Two modes (``publish.mode``):

- ``memory`` (default): no file. The trainer packs its weights into buckets (off the event
  loop) and sends them over a gloo group to each engine's worker extension, all engines at
  once (``memory_publish``). An engine whose update fails is held out (the gateway routes
  around it) and stays so until it is restarted and caught up (``catch_up``); the others take
  the new version.
- ``disk``: a versioned safetensors dir (``save_weights``, refuses NaN, written in a thread),
  then every engine reloads from that path, in parallel. For engines that cannot join a group
  (another host without a route back to the trainer, an engine without our extension). If an
  engine still refuses after retries, the engines that switched are rolled back to the
  previous version and the step fails, so every engine agrees on the live version.

Either way each engine is updated inside ``VLLMBackend.fenced``: new requests wait, requests
in flight finish on the old weights, the engine takes the weights and its version, and only
then serves again, so no turn's tokens come from two versions and every turn is stamped with
the version that generated it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import shutil
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from rollyard.core.errors import RollyardError, TrainError
from rollyard.engines.launcher import has_cuda_gpu
from rollyard.engines.vllm import VLLMBackend
from rollyard.train.checkpoint import save_weights
from rollyard.train.memory_publish import MemoryLinks, slowest_engine, worker_timings
from rollyard.train.nccl_publish import NcclLinks
from rollyard.train.weight_stream import WeightSource

log = logging.getLogger(__name__)

_VERSION_DIR = re.compile(r"^v(\d{6,})$")

PublishMode = Literal["memory", "disk"]


class WeightPublisher:
    """``weights``: the factory of ``(name, tensor)`` pairs for memory mode (default: the model's
    state dict, ``weight_stream.model_weights``); a multi-rank trainer passes one that keeps its
    other ranks in the gather (see ``weight_stream``)."""

    def __init__(
        self,
        engines: Sequence[VLLMBackend],
        root: str | Path,
        *,
        base_path: str | Path,
        base_version: int = 0,
        keep: int = 2,
        retries: int = 3,
        retry_delay_s: float = 1.0,
        tokenizer: Any = None,
        mode: PublishMode = "disk",
        weights: WeightSource | None = None,
        bucket_mb: int = 512,
        host: str = "127.0.0.1",
        timeout_s: float = 120.0,
    ) -> None:
        if keep < 1:
            raise TrainError("keep at least the live version")
        self.engines = list(engines)
        self.root = Path(root)
        self.keep = keep
        self.retries = retries
        self.retry_delay_s = retry_delay_s
        self.tokenizer = tokenizer
        self.mode = mode
        self.version = base_version
        self.path = Path(base_path)
        self.published = 0
        self.last: dict[str, float] = {}  # the last publish's timings (fence drain, transfer)
        # CUDA engines: vLLM's own NCCL transfer (untested here); CPU: gloo into our extension.
        self.links: MemoryLinks | NcclLinks = (
            NcclLinks(host) if has_cuda_gpu() else MemoryLinks(weights, bucket_mb * 2**20, host, timeout_s)
        )
        self._model: Any = None  # the model whose weights are live (memory mode's catch-up source)
        self._changing = asyncio.Lock()  # see ``changing_model``
        self._changer: asyncio.Task[Any] | None = None
        # disk mode: writes more into a version's dir before the engines reload it (the online
        # eagle draft head, ``train/draft_online.py``)
        self.beside: Callable[[Path], None] | None = None

    async def publish(self, model: Any, version: int) -> Path | None:
        """Make ``version`` live on every engine. Disk: returns its dir; on failure the previous
        version stays live everywhere. Memory: returns None; on failure the engines that failed
        are held out and ``TrainError`` names them (the others serve ``version``)."""
        if self.mode == "memory":
            return await self._publish_memory(model, version)
        return await self._publish_disk(model, version)

    # -- memory --------------------------------------------------------------------------------
    async def start(self) -> None:
        """Resume every engine (a run killed during a publish leaves an attached engine paused);
        memory mode: every engine joins its weight group now, so one that cannot fails the run's
        start with a clear ``ConfigError`` rather than its first step."""
        for e in self.engines:
            await e.resume()
            if self.mode == "memory":
                await self.links.join(e)

    async def _publish_memory(self, model: Any, version: int) -> None:
        if version < self.version or (version == self.version and model is not self._model):
            raise TrainError(f"version {version} is not newer than the live version {self.version}")
        behind = [e for e in self.engines if e.policy_version != version]
        if not behind:  # a retry after every engine caught up
            return None
        took = await self.links.send(model, version, behind)
        # the trainer's weights are live wherever the send succeeded (a refusal before any
        # send, e.g. non-finite weights, raised above and changed nothing)
        self._model, self.version = model, version
        self.published += 1
        self.last = took
        failed = [e.name for e in behind if e.held]
        if failed:
            raise TrainError(f"engines {', '.join(failed)} failed to take weights version {version}")
        log.info("published weights version=%d in memory engines=%d %s", version, len(behind), took)
        return None

    @contextlib.asynccontextmanager
    async def changing_model(self) -> AsyncIterator[None]:
        """Held by the training loop from a step until its publish, when the model's weights are
        not the live version's; a catch-up from another task waits for it (one from the same
        task, the publish's own healing, sends the version just published)."""
        async with self._changing:
            self._changer = asyncio.current_task()
            try:
                yield
            finally:
                self._changer = None

    async def catch_up(self, engines: Sequence[VLLMBackend]) -> None:
        """Give restarted (held) engines the live version, then let them serve."""
        if self.mode != "memory":
            for e in engines:
                e.release()
            return
        mine = self._changer is not None and self._changer is asyncio.current_task()
        async with contextlib.nullcontext() if mine else self._changing:
            if self._model is None:  # nothing published yet: the restart's weights are live
                for e in engines:
                    e.release()
                return
            for e in engines:
                self.links.drop(e.name)  # a restarted worker holds no group
                e.release()  # the fence keeps requests out until the weights are in
            await self.links.send(self._model, self.version, list(engines))
        failed = [e.name for e in engines if e.held]
        if failed:
            raise TrainError(f"engines {', '.join(failed)} could not catch up to version {self.version}")

    # -- disk ----------------------------------------------------------------------------------
    async def _load(self, engine: VLLMBackend, path: Path, version: int) -> dict[str, float]:
        """Fence ``engine`` and reload it from ``path``, retried; the worker's own timings."""
        last: Exception | None = None
        for attempt in range(1, self.retries + 1):
            try:
                async with engine.fenced():
                    return worker_timings(await engine.load_weights(str(path), version))
            except RollyardError as e:
                last = e
                engine.release()  # the old weights stay whole: a failed reload is retried
                log.warning(
                    "engine=%s refused weights v%d (attempt %d): %s", engine.name, version, attempt, e
                )
                await asyncio.sleep(self.retry_delay_s * attempt)
        raise TrainError(f"engine {engine.name} refused weights version {version}: {last}")

    async def _publish_disk(self, model: Any, version: int) -> Path:
        if version <= self.version:
            raise TrainError(f"version {version} is not newer than the live version {self.version}")
        t0 = time.perf_counter()
        path = await asyncio.to_thread(save_weights, model, self.root, version, tokenizer=self.tokenizer)
        if self.beside is not None:
            await asyncio.to_thread(self.beside, path)
        t1 = time.perf_counter()
        results = await asyncio.gather(
            *(self._load(e, path, version) for e in self.engines), return_exceptions=True
        )
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            for engine, r in zip(self.engines, results, strict=True):
                if isinstance(r, BaseException):
                    continue
                try:  # roll back so every engine serves the same version
                    async with engine.fenced():
                        await engine.load_weights(str(self.path), self.version)
                except RollyardError as e:
                    log.error("engine=%s could not roll back to v%d: %s", engine.name, self.version, e)
            shutil.rmtree(path, ignore_errors=True)
            raise errors[0]
        self.version, self.path = version, path
        self.published += 1
        timings = [r for r in results if isinstance(r, dict)]
        self.last = {"save_s": t1 - t0, "transfer_s": time.perf_counter() - t1, **slowest_engine(timings)}
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
