"""``SharedPoolConnector``: vLLM's KV-connector API over a ``BlockStore`` that engines share.

Loaded inside the engine (``--kv-transfer-config`` names this module). The scheduler side keys
each request's full blocks by chained hashes (``store.block_keys``) and reports as loadable the
longest run of leading blocks the store holds beyond the engine's own prefix-cache hit; the
worker side copies those blocks into the paged KV cache before the forward pass, and after it
writes every block that became full (prompt and generated tokens alike) that the store lacks.
So a ThunderAgent restore (the program's KV was evicted here) and a Seer migration (the next
turn lands on another engine) load the context and compute only the tokens past the last
stored block. Loads and saves are synchronous; a block that cannot be read is reported to vLLM,
which recomputes it (``kv_load_failure_policy: recompute``).

``kv_connector_extra_config``: ``root`` (the shared directory), ``epoch`` (the weights' version
at start; ``reset_cache`` - vLLM's ``/reset_prefix_cache?reset_external=true`` after a weight
reload - moves to the next, so KV of old weights is never loaded by new ones).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from rollyard.engines.kvpool.store import BlockStore, block_keys

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

_NEVER = 1 << 62  # ``saved_blocks`` of a request whose blocks must not be stored


@dataclass
class PoolMetadata(KVConnectorMetadata):
    """One step's transfers: blocks to load into (key, block id), blocks to save from."""

    loads: list[tuple[str, int]] = field(default_factory=list)
    saves: list[tuple[str, int]] = field(default_factory=list)


@dataclass
class _Tracked:
    request: Request
    keys: list[str] = field(default_factory=list)
    saved_blocks: int = 0  # blocks [0, saved_blocks) are in the store or were queued to be


class SharedPoolConnector(KVConnectorBase_V1):
    def __init__(
        self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        if not extra.get("root"):
            raise ValueError(
                "SharedPoolConnector needs kv_connector_extra_config.root (the shared directory)"
            )
        self._block_size = vllm_config.cache_config.block_size
        self._root = str(extra["root"])
        self._epoch = int(extra.get("epoch", 0))
        self._identity = _identity(vllm_config, kv_cache_config)
        self._store = self._open_store()
        self._tracked: dict[str, _Tracked] = {}
        self._local_blocks: dict[str, int] = {}  # req id -> blocks its own prefix cache held
        self._pending_loads: list[tuple[str, int]] = []
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._failed: set[int] = set()

    def _open_store(self) -> BlockStore:
        ns = hashlib.sha256(f"{self._identity}|epoch={self._epoch}".encode()).hexdigest()[:24]
        return BlockStore(self._root, ns)

    # ---- scheduler side ----

    def _keys(self, request: Request, tracked: _Tracked | None = None) -> list[str]:
        salt = request.cache_salt or ""
        start = tracked.keys if tracked is not None else None
        keys = block_keys(request.all_token_ids, self._block_size, salt, start=start)
        if tracked is not None:
            tracked.keys = keys
        return keys

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        # vLLM must compute at least one token itself: stop one token short of the prompt's end.
        usable = (request.num_tokens - 1) // self._block_size
        keys = self._keys(request)[:usable]
        local = num_computed_tokens // self._block_size
        self._local_blocks[request.request_id] = local
        stored = self._store.hits(keys)
        return max(0, stored - local) * self._block_size, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        tracked = self._tracked.setdefault(request.request_id, _Tracked(request))
        tracked.request = request
        local = self._local_blocks.pop(request.request_id, 0)
        if num_external_tokens <= 0:
            return
        block_ids = blocks.get_block_ids()[0]
        keys = self._keys(request, tracked)
        n = num_external_tokens // self._block_size
        self._pending_loads += [(keys[b], block_ids[b]) for b in range(local, local + n)]
        # What was just loaded is in the store already.
        tracked.saved_blocks = max(tracked.saved_blocks, local + n)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = PoolMetadata(loads=self._pending_loads)
        self._pending_loads = []
        computed = {r.req_id: r.num_computed_tokens for r in scheduler_output.scheduled_new_reqs}
        cached = scheduler_output.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
        for req_id, start in computed.items():
            tracked = self._tracked.get(req_id)
            if tracked is None or self._kv_cache_manager is None:
                continue
            done = start + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            full = min(done, tracked.request.num_tokens) // self._block_size
            if full <= tracked.saved_blocks:
                continue
            keys = self._keys(tracked.request, tracked)
            block_ids = self._kv_cache_manager.get_block_ids(req_id)[0]
            for b in range(tracked.saved_blocks, min(full, len(keys), len(block_ids))):
                if not self._store.has(keys[b]):
                    meta.saves.append((keys[b], block_ids[b]))
            tracked.saved_blocks = full
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._tracked.pop(request.request_id, None)
        self._local_blocks.pop(request.request_id, None)
        return False, None

    def reset_cache(self) -> bool:
        """New weights: later keys live under the next epoch (the old blocks stay for engines still
        on the old weights; ``BlockStore.clear`` of an old epoch is the caller's to do)."""
        self._epoch += 1
        self._store = self._open_store()
        for tracked in self._tracked.values():
            # A request running across the reload holds KV of the old weights: never store it.
            tracked.saved_blocks = _NEVER
        return True

    # ---- worker side ----

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._kv_caches = dict(sorted(kv_caches.items()))
        self._block_dim = {name: _block_dim(t, self._num_blocks()) for name, t in self._kv_caches.items()}

    def _num_blocks(self) -> int:
        return int(self._kv_cache_config.num_blocks)

    def _block(self, name: str, block_id: int) -> torch.Tensor:
        return self._kv_caches[name].select(self._block_dim[name], block_id)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PoolMetadata)
        for key, block_id in meta.loads:
            blocks = [self._block(n, block_id) for n in self._kv_caches]
            data = self._store.get(key)
            if data is None or not read_block(data, blocks):
                self._failed.add(block_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: AttentionMetadata, **kwargs: Any
    ) -> None:
        return  # whole blocks are written after the forward pass (wait_for_save)

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, PoolMetadata)
        for key, block_id in meta.saves:
            self._store.put(key, block_bytes([self._block(n, block_id) for n in self._kv_caches]))

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed = self._failed, set()
        return failed


def _byte_view(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)  # any dtype (bf16 too: numpy has none); the last dim is contiguous


def block_bytes(blocks: list[torch.Tensor]) -> bytes:
    """One block's KV over all layers, as bytes. Through numpy, not torch: a torch copy on a
    loaded CPU waits on its OpenMP pool (measured 64 ms per 256 KiB block at load 27 with 2
    threads, 0.03 ms with numpy's single-threaded copy)."""
    return b"".join(_byte_view(b if b.device.type == "cpu" else b.cpu()).numpy().tobytes() for b in blocks)


def read_block(data: bytes, blocks: list[torch.Tensor]) -> bool:
    """Copy ``block_bytes`` output into the blocks of the paged cache; False if sizes differ."""
    views = [_byte_view(b) for b in blocks]
    if len(data) != sum(v.numel() for v in views):
        return False
    src = np.frombuffer(data, dtype=np.uint8)
    offset = 0
    for view in views:
        part = src[offset : offset + view.numel()].reshape(tuple(view.shape))
        if view.device.type == "cpu":
            np.copyto(view.numpy(), part)
        else:
            view.copy_(torch.from_numpy(part.copy()).to(view.device))
        offset += view.numel()
    return True


def _block_dim(t: torch.Tensor, num_blocks: int) -> int:
    """Which dimension indexes blocks: 0 on the CPU backend ([blocks, heads, block, 2*dim]),
    1 where K and V lead ([2, blocks, ...], as on CUDA's flash attention)."""
    if t.dim() > 1 and t.shape[0] == 2 and t.shape[1] == num_blocks:
        return 1
    if t.shape[0] == num_blocks:
        return 0
    raise ValueError(f"cannot find the block dimension of a KV cache of shape {tuple(t.shape)}")


def _identity(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig) -> str:
    """What makes two engines' KV bytes interchangeable: model, dtype, block layout."""
    mc = vllm_config.model_config
    specs = [repr(g.kv_cache_spec) for g in kv_cache_config.kv_cache_groups]
    return f"{mc.model}|{mc.dtype}|{vllm_config.cache_config.block_size}|{specs}"
