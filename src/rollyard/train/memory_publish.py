"""Memory mode's transfer: the trainer's weights into every engine at once, behind each one's fence.

``MemoryLinks`` keeps one gloo link per engine (``weight_stream.GlooLink``), opened on first
use through the worker extension's join RPC. A send packs the weights once, in a thread, then
for every engine concurrently: fence it, post the receive RPC (the plan travels in the RPC,
the bytes over gloo, sent from a thread), commit the version, lift the fence. Nothing of this
runs on the event loop but the HTTP calls, so the gateway sharing it stays responsive.

An engine that fails anywhere in this is held out (``VLLMBackend.hold``) and its link dropped;
the worker loads nothing until every bucket has arrived, so its old model stays whole until
it is restarted and caught up (``WeightPublisher.catch_up``).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

from rollyard.core.errors import ConfigError, RollyardError
from rollyard.engines.vllm import VLLMBackend
from rollyard.train.weight_stream import GlooLink, WeightSource, model_weights, pack

log = logging.getLogger(__name__)


def worker_timings(results: Any) -> dict[str, float]:
    """The first worker's timings from a weight-update RPC's answers (``receive_s``, ``load_s``,
    ``repack_s``), or none from an engine whose extension does not report them."""
    first = results[0] if isinstance(results, list) and results else None
    if not isinstance(first, dict):
        return {}
    return {k: float(v) for k, v in first.items() if k.endswith("_s") and isinstance(v, int | float)}


def slowest_engine(timings: Sequence[dict[str, float]]) -> dict[str, float]:
    """Each worker timing's maximum over the engines, as ``engine_<name>``: the slowest engine
    sets the publish's time, so its split says where that time went."""
    keys = sorted({k for t in timings for k in t})
    return {f"engine_{k}": max(t.get(k, 0.0) for t in timings) for k in keys}


class MemoryLinks:
    def __init__(self, weights: WeightSource | None, bucket_bytes: int, host: str, timeout_s: float) -> None:
        self.weights = weights
        self.bucket_bytes = bucket_bytes
        self.host = host
        self.timeout_s = timeout_s
        self._links: dict[str, GlooLink] = {}
        # more (name, tensor) pairs sent after the model's: the online eagle draft head's
        self.extra: Callable[[], Iterable[tuple[str, torch.Tensor]]] | None = None

    async def join(self, engine: VLLMBackend) -> GlooLink:
        """The engine's link, opened now if it has none (both ends block until the other joins)."""
        link = self._links.get(engine.name)
        if link is not None and link.ready:
            return link
        link = GlooLink(self.host, self.timeout_s)
        port = link.listen()
        connecting = asyncio.create_task(asyncio.to_thread(link.connect))
        try:
            workers = await engine.rpc(
                "rollyard_join_weight_group", host=self.host, port=port, timeout_s=self.timeout_s
            )
        except RollyardError as e:
            connecting.cancel()
            raise ConfigError(
                f"engine {engine.name} cannot join the trainer's weight group at {self.host} ({e}); "
                "engines without rollyard's worker extension, or on a host that cannot reach "
                "publish.host, need publish.mode: disk"
            ) from e
        if len(workers) != 1:
            raise ConfigError(f"engine {engine.name} has {len(workers)} workers; memory publish takes one")
        await connecting
        self._links[engine.name] = link
        return link

    async def send(self, model: Any, version: int, engines: Sequence[VLLMBackend]) -> dict[str, float]:
        """``model``'s weights become ``version`` on ``engines``; failures are held out, not raised.
        Returns timings: pack_s, drain_s (the slowest fence), transfer_s (fence to resume)."""
        t0 = time.perf_counter()
        source = self.weights or (lambda: model_weights(model))
        extra = self.extra or (lambda: ())
        buckets = await asyncio.to_thread(lambda: pack(itertools.chain(source(), extra()), self.bucket_bytes))
        plan = json.dumps([b.plan() for b in buckets])
        flats = await asyncio.to_thread(lambda: [b.flat() for b in buckets])
        t1 = time.perf_counter()
        updates = await asyncio.gather(*(self._update(e, plan, flats, version) for e in engines))
        return {
            "pack_s": t1 - t0,
            "drain_s": max((d for d, _ in updates), default=0.0),
            "transfer_s": time.perf_counter() - t1,
            "bytes": float(sum(f.numel() * f.element_size() for f in flats)),
            **slowest_engine([t for _, t in updates]),
        }

    async def _update(
        self, engine: VLLMBackend, plan: str, flats: list[torch.Tensor], version: int
    ) -> tuple[float, dict[str, float]]:
        """One engine: fence, receive, commit; on any failure it is held out. The fence's drain
        and the worker's own timings of the update (none if it failed)."""
        drained, timings = 0.0, {}
        try:
            link = await self.join(engine)
            async with engine.fenced() as drained:
                receiving = asyncio.create_task(
                    engine.rpc("rollyard_receive_weights", plan=plan, version=version)
                )
                sending = asyncio.create_task(asyncio.to_thread(self._send_all, link, flats))
                done = await asyncio.gather(receiving, sending, return_exceptions=True)
                for r in done:
                    if isinstance(r, BaseException):
                        raise r
                engine.commit(version)
                timings = worker_timings(done[0])
        except Exception as e:  # held out (the fence did it, or here if the fence never began)
            self._links.pop(engine.name, None)
            if engine.held is None:
                engine.hold(f"weight update to v{version} failed: {type(e).__name__}: {e}")
            log.error("engine=%s failed to take weights v%d: %s", engine.name, version, e)
        return drained, timings

    @staticmethod
    def _send_all(link: GlooLink, flats: list[torch.Tensor]) -> None:
        for flat in flats:
            link.send(flat)

    def drop(self, name: str) -> None:
        """Forget an engine's link (it was restarted: its worker holds no group)."""
        self._links.pop(name, None)
