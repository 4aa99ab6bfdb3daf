"""``rollyard plan``: per-rank GPU memory of a training set-up, before renting the GPUs.

Parameter counts come from the real architecture built on the meta device (no weights, no memory:
``AutoModelForCausalLM.from_config`` under ``torch.device("meta")``), so tied embeddings, biases
and GQA are counted as transformers builds them. The rest is arithmetic, per rank, in GB (1e9 B):

- parameters ``P x b`` (b = 4 fp32, 2 bf16); gradients ``T x b`` (T trainable); AdamW two fp32
  states ``8 T``, plus an fp32 master copy ``4 T`` with bf16. FSDP2 divides all three by the world
  size; ``replicate`` keeps them whole.
- FSDP2 gather buffers (world > 1): the root's own parameters (embeddings, head, final norm; the
  root is not resharded after forward) and the largest decoder layer unsharded three times (the
  layer in use, the prefetched one, and its unsharded gradient before reduce-scatter), all ``x b``.
- activations per micro-batch of ``token_budget`` tokens (gradient accumulation keeps one alive):
  a decoder layer saves ``4h + 2q + 2kv + 4i`` values per token (two norms' inputs and outputs,
  q/k/v, attention output, gate/up/act/product of the MLP), ``x b``. Without checkpointing every
  layer keeps them; with it each layer keeps its input (``h``) and one layer is recomputed at once.
- logits: chunked, ``rows x V x (8 + 2 if bf16)`` (fp32 logits and softmax, the bf16 matmul output)
  plus the head's unsharded gradient accumulator ``V x h x b``; unchunked, ``5.1 x L x V x 4``
  (measured on this trainer's full-logits path).
- a fixed runtime reserve (CUDA context, NCCL buffers, allocator slack).

Estimates, not measurements: ``tests/gpu`` checks the logits part on a GPU.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollyard.core.errors import ConfigError

GB = 1e9
CONFIG_DIR = Path(__file__).parent / "model_configs"
FULL_LOGITS_FACTOR = 5.1  # peak / (L x V x 4 B) of the full-logits loss step, measured on CPU fp32


@dataclass(frozen=True)
class PlanSetup:
    """What the plan depends on besides the model (the ``trainer:`` keys, and the cluster)."""

    world_size: int = 1
    dtype: Literal["fp32", "bf16"] = "fp32"
    parallel: Literal["fsdp2", "replicate"] = "fsdp2"
    activation_checkpointing: bool = False
    token_budget: int = 8192
    logits_chunk: int = 512
    train_layers: int | None = None
    gpu_mem_gb: float = 80.0
    reserve_gb: float = 2.0


@dataclass
class MemoryPlan:
    """Per-rank bytes by part, and what is left of the GPU."""

    model: str
    setup: PlanSetup
    params: int  # parameter count
    trainable: int
    rows: dict[str, float] = field(default_factory=dict)  # bytes per rank
    activations_other: float = 0.0  # activations with the other checkpointing choice

    @property
    def total(self) -> float:
        return sum(self.rows.values())

    @property
    def headroom_gb(self) -> float:
        return self.setup.gpu_mem_gb - self.total / GB

    @property
    def headroom_other_gb(self) -> float:
        return self.headroom_gb + (self.rows["activations"] - self.activations_other) / GB

    def render(self) -> str:
        s = self.setup
        ac = "on" if s.activation_checkpointing else "off"
        lines = [
            f"model {self.model}: {self.params / 1e9:.3f}B parameters ({self.trainable / 1e9:.3f}B trained)",
            f"{s.world_size} rank(s) x {s.gpu_mem_gb:g} GB, {s.parallel}, {s.dtype}, "
            f"{s.token_budget} tokens per micro-batch, logits chunk {s.logits_chunk or 'off'}, "
            f"activation checkpointing {ac}",
        ]
        lines += [f"  {name:<22}{b / GB:9.2f} GB" for name, b in self.rows.items()]
        lines.append(f"  {'total':<22}{self.total / GB:9.2f} GB")
        lines.append(f"headroom per rank: {self.headroom_gb:.2f} GB")
        other = "off" if s.activation_checkpointing else "on"
        lines.append(f"(with activation checkpointing {other}: {self.headroom_other_gb:.2f} GB)")
        return "\n".join(lines)


def shipped_models() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.json"))


def model_config(name_or_path: str | Path) -> Any:
    """A transformers config: a shipped name (``qwen2.5-7b``), a rollyard size (``tiny``), or a
    path to a ``config.json`` or to a model directory holding one."""
    from transformers import AutoConfig

    from rollyard.train.models import model_config_for, model_sizes

    name = str(name_or_path)
    if name in model_sizes():
        return model_config_for(name)
    path = CONFIG_DIR / f"{name}.json" if name in shipped_models() else Path(name)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        known = ", ".join([*shipped_models(), *model_sizes()])
        raise ConfigError(f"no model config {name!r}: give a config.json path or one of {known}")
    try:
        doc = json.loads(path.read_text())
        return AutoConfig.for_model(doc.pop("model_type"), **doc)
    except (ValueError, KeyError) as e:
        raise ConfigError(f"{path}: not a transformers model config ({e})") from None


def meta_model(config: Any) -> Any:
    """The architecture with every tensor on the meta device: shapes only, no bytes."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


def plan_memory(config: Any, setup: PlanSetup, name: str = "") -> MemoryPlan:
    """The per-rank memory plan of ``config``'s model under ``setup``."""
    from rollyard.train.trainer import freeze_below

    model = meta_model(config)
    if setup.train_layers is not None:
        freeze_below(model, setup.train_layers)
    params = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    layers = list(model.model.layers)
    layer = max(sum(p.numel() for p in m.parameters()) for m in layers)
    root = params - sum(sum(p.numel() for p in m.parameters()) for m in layers)

    b = 4 if setup.dtype == "fp32" else 2
    sharded = setup.parallel == "fsdp2"
    shard = setup.world_size if sharded else 1
    plan = MemoryPlan(model=name or type(model).__name__, setup=setup, params=params, trainable=trainable)
    plan.rows["parameters"] = params * b / shard
    plan.rows["gradients"] = trainable * b / shard
    plan.rows["optimizer"] = trainable * (8 + (4 if setup.dtype == "bf16" else 0)) / shard
    if sharded and setup.world_size > 1:
        plan.rows["fsdp gather buffers"] = (root + 3 * layer) * b
    with_ac, without_ac = _activations(config, len(layers), setup.token_budget, b)
    plan.rows["activations"] = with_ac if setup.activation_checkpointing else without_ac
    plan.activations_other = without_ac if setup.activation_checkpointing else with_ac
    plan.rows["logits"] = _logits(config, setup, b, head_trained=model.lm_head.weight.requires_grad)
    plan.rows["runtime reserve"] = setup.reserve_gb * GB
    return plan


def _activations(config: Any, n_layers: int, tokens: int, b: int) -> tuple[float, float]:
    """(with, without) activation checkpointing: bytes saved for backward in one micro-batch."""
    h = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    head_dim = int(getattr(config, "head_dim", None) or h // heads)
    q = heads * head_dim
    kv = int(getattr(config, "num_key_value_heads", None) or heads) * head_dim
    per_token = 4 * h + 2 * q + 2 * kv + 4 * int(config.intermediate_size)
    one_layer = tokens * per_token * b
    return n_layers * tokens * h * b + one_layer, n_layers * one_layer


def _logits(config: Any, setup: PlanSetup, b: int, *, head_trained: bool) -> float:
    vocab, h = int(config.vocab_size), int(config.hidden_size)
    if setup.logits_chunk <= 0:
        return FULL_LOGITS_FACTOR * setup.token_budget * vocab * 4
    rows = min(setup.logits_chunk, setup.token_budget)
    work = rows * vocab * (8 + (2 if b == 2 else 0))
    return work + (vocab * h * b if head_trained else 0)


def setup_from_trainer(trainer: Any, **flags: Any) -> PlanSetup:
    """A ``PlanSetup`` from a ``trainer:`` config section; flags that are not ``None`` win."""
    parallel = getattr(getattr(trainer, "parallel", None), "kind", None)
    known = {
        "world_size": getattr(trainer, "world_size", None),
        "dtype": getattr(trainer, "dtype", None),
        "parallel": parallel,
        "activation_checkpointing": getattr(trainer, "activation_checkpointing", None),
        "token_budget": getattr(trainer, "token_budget", None),
        "logits_chunk": getattr(trainer, "logits_chunk", None),
        "train_layers": getattr(trainer, "train_layers", None),
    }
    known.update({k: v for k, v in flags.items() if v is not None})
    setup = PlanSetup(**{k: v for k, v in known.items() if v is not None})
    if setup.dtype not in ("fp32", "bf16"):
        raise ConfigError(f"dtype must be fp32 or bf16, not {setup.dtype!r}")
    if setup.parallel not in ("fsdp2", "replicate"):
        raise ConfigError(f"parallel must be fsdp2 or replicate, not {setup.parallel!r}")
    if setup.world_size < 1 or setup.gpu_mem_gb <= 0:
        raise ConfigError("world size must be >= 1 and GPU memory > 0")
    return setup
