"""FSDP2 for the trainer: where a rank's model lives, how it is wrapped, and its full weights.

``trainer.parallel.kind``:

- ``fsdp2``: ``fully_shard`` on every decoder layer and on the root over a 1-D mesh of all
  ranks: parameters, gradients and AdamW state are split across ranks; each layer's weights are
  all-gathered for its forward (and again for its backward) and its gradients reduce-scattered.
- ``replicate``: the same ``fully_shard`` over a 2-D mesh ``(world, 1)`` (HSDP with one rank per
  shard): every rank keeps whole weights and FSDP all-reduces the gradients, DDP's arithmetic
  without a second wrapper to maintain.

Either way torch's collectives move the gradients; losses are weighted by the global batch's
totals, so gradients are summed over ranks, not averaged (divide factor 1, sum-only ops, which
gloo needs: it has no pre-multiplied sum). Rank 0's weights are broadcast into every shard when
wrapping, so ranks need not build identical models.

``trainer.dtype: bf16`` sets FSDP2's ``MixedPrecisionPolicy``: sharded fp32 master weights,
bf16 compute, fp32 gradient reduction. A process group is needed for it even at one rank.
"""

from __future__ import annotations

import os
from typing import Any, Literal

import torch
import torch.distributed as dist
from pydantic import BaseModel, ConfigDict

from rollyard.core.errors import ConfigError

ParallelKind = Literal["fsdp2", "replicate"]
Dtype = Literal["fp32", "bf16"]


class ParallelConfig(BaseModel):
    """How ranks share the model when a process group is up (``trainer.world_size > 1``)."""

    model_config = ConfigDict(extra="forbid")

    kind: ParallelKind = "fsdp2"


def rank_device() -> torch.device:
    """``cuda:LOCAL_RANK`` where CUDA is present (LOCAL_RANK from torchrun or a worker rank; else
    the device this process set before joining: rank 0 on Ray takes the GPU Ray reserved for it),
    CPU otherwise."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    default = torch.cuda.current_device() if dist.is_initialized() else 0
    local = int(os.environ.get("LOCAL_RANK", default))
    return torch.device("cuda", local % torch.cuda.device_count())


def check_dtype(dtype: Dtype, device: torch.device) -> None:
    """bf16 only where it pays: on this project's CPUs fp32 trains 4-20x faster than bf16
    (docs/training.md), and gloo reduces bf16 no faster, so a CPU run asking for it is a mistake."""
    if dtype == "bf16" and device.type != "cuda":
        raise ConfigError("trainer.dtype: bf16 needs a CUDA device; on CPU keep fp32 (faster there)")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """A transformers decoder-only LM's blocks (``model.model.layers``: Llama, Qwen2/3, SmolLM2)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ConfigError(f"expected a decoder LM with .model.layers, not {type(model).__name__}")
    return layers


def shard_model(model: torch.nn.Module, kind: ParallelKind, dtype: Dtype, device: torch.device) -> None:
    """Wrap ``model`` in place with ``fully_shard`` (layers, then root) on the default group's
    ranks, and load rank 0's weights into every rank's shard. Collective: every rank calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    world = dist.get_world_size()
    if kind == "replicate":
        mesh = init_device_mesh(device.type, (world, 1), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    mp = (
        MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        if dtype == "bf16"
        else MixedPrecisionPolicy()
    )
    full = {k: v.detach().cpu() for k, v in model.state_dict().items()} if dist.get_rank() == 0 else {}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    for module in model.modules():  # each wrapped module reduces its own gradients
        if isinstance(module, FSDPModule):
            module.set_gradient_divide_factor(1.0)
            module.set_force_sum_reduction_for_comms(True)
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, full, options=options)


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a (possibly distributed) tensor."""
    from torch.distributed.tensor import DTensor

    return t.to_local() if isinstance(t, DTensor) else t


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's weights on rank 0's CPU (other ranks get ``{}``). Collective."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options)


def weights_view(model_cls: type, config: Any, generation: Any, weights: dict[str, torch.Tensor]) -> Any:
    """A plain (unwrapped) CPU model holding ``weights`` without copying them: what ``save_weights``
    publishes. Built on the meta device, then the gathered tensors are assigned in."""
    with torch.device("meta"):
        shell = model_cls(config)
    shell.load_state_dict(weights, strict=False, assign=True)
    shell.tie_weights()
    if generation is not None:
        shell.generation_config = generation
    return shell.eval()


def state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """This rank's parameter + gradient + optimizer-state bytes (its shards under FSDP2)."""
    total = 0
    for p in model.parameters():
        total += local(p).nbytes
        if p.grad is not None:
            total += local(p.grad).nbytes
    for state in optimizer.state.values():
        total += sum(local(v).nbytes for v in state.values() if isinstance(v, torch.Tensor))
    return total
