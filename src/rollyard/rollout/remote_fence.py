"""The run's handle on an engine whose version fence lives in the gateway process.

The publisher and the fleet drive weight updates and restarts through ``VLLMBackend``'s fence
interface (``fenced``, ``commit``, ``hold``, ``release``, ``serving``). The requests the fence
must wait for and stamp are the gateway's, so with the gateway in its own process those calls
go to it (``GatewayClient``), while the weights themselves go straight from the trainer to the
engine (``rpc``, ``load_weights``): no weight byte passes through the gateway.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from rollyard.engines.vllm import VLLMBackend
from rollyard.rollout.gateway_client import GatewayClient


class RemoteFenced(VLLMBackend):
    """A ``VLLMBackend`` whose fence and hold state are the gateway's (``gateway`` set once it
    runs; before that there is nothing to fence and the state is kept here)."""

    def __init__(self, url: str, **kwargs: Any) -> None:
        super().__init__(url, **kwargs)
        self.gateway: GatewayClient | None = None

    @contextlib.asynccontextmanager
    async def fenced(self) -> AsyncIterator[float]:
        if self.gateway is None:
            async with super().fenced() as drained:
                yield drained
            return
        drained = await self.gateway.enter_fence(self.name)
        try:
            yield drained
        except BaseException as e:
            why = f"weight update failed: {type(e).__name__}: {e}"
            self._held = why
            with contextlib.suppress(Exception):  # the update's own error is the one to raise
                await self.gateway.leave_fence(self.name, self._version, why)
            raise
        await self.gateway.leave_fence(self.name, self._version, None)

    def hold(self, why: str) -> None:
        super().hold(why)
        if self.gateway is not None:
            self.gateway.hold(self.name, why)

    def release(self) -> None:
        super().release()
        if self.gateway is not None:
            self.gateway.release(self.name)

    def serving(self, version: int) -> None:
        super().serving(version)
        if self.gateway is not None:
            self.gateway.serving(self.name, version)
