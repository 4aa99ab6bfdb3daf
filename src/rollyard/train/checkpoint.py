"""Atomic sharded checkpoints (model, optimizer, step, RNG, opaque extra state) and versioned
weight dirs.

Model and optimizer go through ``torch.distributed.checkpoint`` (DCP): every rank writes its own
shards, keyed by parameter name rather than by rank, so a checkpoint saved by N ranks loads at
any world size (DCP reshards on load), with FSDP2 or without it. Everything is written into a
temporary sibling directory that rank 0 renames into place, so a crash leaves either the previous
checkpoint or the new one, never half of one. Checkpoints of the earlier format (one
``model.safetensors`` plus ``optimizer.pt``) still load.
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file

from rollyard.core.errors import ConfigError, TrainError

logger = logging.getLogger(__name__)

_META = "trainer.json"
_SHARDS = "dcp"  # the DCP directory inside a checkpoint


def stage_dir(final: Path) -> Path:
    """An empty temporary sibling of ``final`` to write into, then ``commit_dir``."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def commit_dir(tmp: Path, final: Path) -> None:
    if final.exists():  # replace: move the old one aside first so the rename itself is atomic
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def write_shards(staged: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """This rank's model and optimizer shards into ``staged`` (rank 0 made it). Collective."""
    from torch.distributed.checkpoint import save
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    save({"model": model_state, "optim": optim_state}, checkpoint_id=staged / _SHARDS)


def commit_checkpoint(
    staged: Path, final: Path, meta: dict[str, Any], extra_state: dict[str, Any] | None = None
) -> Path:
    """Rank 0: RNG, ``extra_state`` and ``meta`` (JSON: step, counters, config), then the rename."""
    torch.save({"rng": rng_state(), "extra_state": extra_state or {}}, staged / "state.pt")
    (staged / _META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    commit_dir(staged, final)
    logger.info("checkpoint saved path=%s step=%s", final, meta.get("step"))
    return final


def load_checkpoint(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore model, optimizer and RNG on this rank; returns (meta, extra_state). Collective."""
    p = Path(path)
    if not (p / _META).is_file():
        raise ConfigError(f"{p} is not a rollyard checkpoint (no {_META})")
    if (p / _SHARDS).is_dir():
        _load_shards(p / _SHARDS, model, optimizer)
    elif (p / "model.safetensors").is_file():
        _load_single_file(p, model, optimizer)
    else:
        raise ConfigError(f"{p} has neither sharded ({_SHARDS}/) nor single-file weights")
    state = torch.load(p / "state.pt", weights_only=False)
    set_rng_state(state["rng"])
    return json.loads((p / _META).read_text()), state["extra_state"]


def _load_shards(shards: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    from torch.distributed.checkpoint import load
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)  # the layout to load into
    state = {"model": model_state, "optim": optim_state}
    try:
        load(state, checkpoint_id=shards)
    except Exception as e:  # DCP names the missing or misshapen keys
        raise TrainError(f"checkpoint {shards.parent} does not fit the model: {e}") from e
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def _load_single_file(p: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """The earlier format: whole weights (tied head left out) and an optimizer state dict keyed by
    the position of each trainable parameter; mapped to names so it loads into shards too."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    weights = load_file(str(p / "model.safetensors"))
    names = dict(model.named_parameters())
    unknown = sorted(set(weights) - set(model.state_dict()))
    missing = sorted(set(names) - set(weights) - {"lm_head.weight"})
    if missing or unknown:
        raise TrainError(f"checkpoint does not fit the model: missing={missing} unexpected={unknown}")
    if "lm_head.weight" in model.state_dict() and "lm_head.weight" not in weights:
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]  # tied: saved once
    old = torch.load(p / "optimizer.pt", weights_only=False)
    trainable = [n for n, q in model.named_parameters() if q.requires_grad]
    optim = {
        "state": {trainable[i]: s for i, s in old["state"].items()},
        "param_groups": [{**g, "params": [trainable[i] for i in g["params"]]} for g in old["param_groups"]],
    }
    options = StateDictOptions(full_state_dict=True)
    set_state_dict(model, optimizer, model_state_dict=weights, optim_state_dict=optim, options=options)


def save_weights(model: Any, directory: str | Path, version: int, tokenizer: Any = None) -> Path:
    """Write ``DIR/v{version:06d}`` as a Hugging Face safetensors model dir, atomically.

    An engine pointed at the returned path sees either no directory or a complete one.
    """
    if version < 0:
        raise ConfigError(f"weight version must be >= 0, got {version}")
    for name, t in model.state_dict().items():
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise TrainError(f"refusing to publish non-finite weights ({name})")
    final = Path(directory) / f"v{version:06d}"
    tmp = stage_dir(final)
    model.save_pretrained(str(tmp), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    (tmp / "rollyard_version.json").write_text(json.dumps({"version": version}))
    commit_dir(tmp, final)
    return final
