"""Memory mode on CUDA engines: vLLM's own NCCL weight transfer. UNTESTED: no GPU here.

vLLM 0.32 ships the trainer side (``NCCLTrainerWeightTransferEngine``) and the server routes
(``/init_weight_transfer_engine``, ``/start_weight_update``, ``/update_weights``,
``/finish_weight_update``; engines need ``--weight-transfer-config '{"backend": "nccl"}'``,
which the launcher passes on CUDA). Its HTTP client talks to one server and gives every
worker rank offset 1; ``FleetClient`` fans each call out to all engines at once and gives
engine i's worker rank 1 + i, so one NCCL broadcast from the trainer (rank 0) reaches every
engine. Same interface as ``MemoryLinks`` (``join``, ``send``); each engine is fenced around
the transfer. A failure breaks the NCCL group for all, so every engine is held out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rollyard.core.net import free_port
from rollyard.engines.access import engine_http
from rollyard.engines.vllm import VLLMBackend

log = logging.getLogger(__name__)


class FleetClient:
    """vLLM's weight-sync client, over every engine at once (one worker each)."""

    def __init__(self, urls: Sequence[str]) -> None:
        from vllm.distributed.weight_transfer.clients import HTTPVLLMWeightSyncClient

        class Keyed(HTTPVLLMWeightSyncClient):  # type: ignore[misc]
            """vLLM's client posts without headers; rollyard's engines want the engine key."""

            def _post(self, path: str, json: dict[str, Any] | None = None) -> None:
                with engine_http(timeout=self.timeout) as http:
                    http.post(f"{self.base_url}/{path}", json=json).raise_for_status()

        self.clients = [Keyed(u) for u in urls]

    def _all(self, call: str, payload: list[Any]) -> None:
        with ThreadPoolExecutor(len(self.clients)) as ex:
            for f in [ex.submit(getattr(c, call), *p) for c, p in zip(self.clients, payload, strict=True)]:
                f.result()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        offsets = [[{**init_info, "rank_offset": 1 + i}] for i in range(len(self.clients))]
        self._all("init_weight_transfer_engine", offsets)

    def shutdown_weight_transfer_engine(self) -> None:
        self._all("shutdown_weight_transfer_engine", [[] for _ in self.clients])

    def start_weight_update(self) -> None:
        self._all("start_weight_update", [[] for _ in self.clients])

    def update_weights(self, update_info: Any) -> None:
        self._all("update_weights", [[update_info] for _ in self.clients])

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._all("finish_weight_update", [[weight_version] for _ in self.clients])


class NcclLinks:
    def __init__(self, host: str) -> None:
        self.host = host
        self._engine: Any = None
        self._model: Any = None
        self._urls: list[str] = []

    async def join(self, engine: VLLMBackend) -> None:
        """The NCCL group is formed on the first send (it needs the model); nothing to do."""

    def _open(self, model: Any, engines: Sequence[VLLMBackend]) -> None:
        from vllm.distributed.weight_transfer.base import ModuleSource
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        info = NCCLTrainerInitInfo(
            master_address=self.host, master_port=free_port(), world_size=1 + len(engines), rank=0
        )
        client = FleetClient([e.url for e in engines])
        self._engine = NCCLTrainerWeightTransferEngine.trainer_init(
            info, client=client, source=ModuleSource(model)
        )
        self._model = model

    async def send(self, model: Any, version: int, engines: Sequence[VLLMBackend]) -> dict[str, float]:
        """Like ``MemoryLinks.send``: failures are held out, not raised."""
        t0 = time.perf_counter()
        urls = [e.url for e in engines]
        async with contextlib.AsyncExitStack() as fences:
            drains = [await fences.enter_async_context(e.fenced()) for e in engines]
            try:
                if self._engine is None or self._model is not model or self._urls != urls:
                    await asyncio.to_thread(self._open, model, engines)
                    self._urls = urls
                await asyncio.to_thread(self._engine.send_weights)
            except Exception as e:  # the NCCL group is unusable for every engine in it
                self._engine = None
                for b in engines:
                    b.hold(f"NCCL weight update to v{version} failed: {type(e).__name__}: {e}")
                log.error("NCCL weight transfer of v%d failed: %s", version, e)
            else:
                for b in engines:
                    b.commit(version)
        return {"drain_s": max(drains, default=0.0), "transfer_s": time.perf_counter() - t0}

    def drop(self, name: str) -> None:
        """A restarted engine left the NCCL group: it is formed again on the next send."""
        self._engine = None
