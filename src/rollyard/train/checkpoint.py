"""Atomic checkpoints (model, optimizer, step, RNG, opaque extra state) and versioned weight dirs.

Everything is written into a temporary sibling directory and renamed into place, so a crash
leaves either the previous checkpoint or the new one, never half of one.
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
from safetensors.torch import load_file, save_file

from rollyard.core.errors import ConfigError, TrainError

logger = logging.getLogger(__name__)

_META = "trainer.json"


def _atomic_dir(final: Path) -> Path:
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _commit_dir(tmp: Path, final: Path) -> None:
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


def save_checkpoint(
    path: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    meta: dict[str, Any],
    extra_state: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint directory atomically; ``meta`` must be JSON (step, counters, config)."""
    final = Path(path)
    tmp = _atomic_dir(final)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    _dedupe_tied(state)
    save_file(state, str(tmp / "model.safetensors"))
    torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    torch.save({"rng": rng_state(), "extra_state": extra_state or {}}, tmp / "state.pt")
    (tmp / _META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    _commit_dir(tmp, final)
    logger.info("checkpoint saved path=%s step=%s", final, meta.get("step"))
    return final


def _dedupe_tied(state: dict[str, torch.Tensor]) -> None:
    """safetensors refuses shared storage; tied weights are restored by the model on load."""
    head, emb = state.get("lm_head.weight"), state.get("model.embed_tokens.weight")
    if head is not None and emb is not None and torch.equal(head, emb):
        del state["lm_head.weight"]


def load_checkpoint(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Restore model (and optimizer, RNG); returns (meta, extra_state)."""
    p = Path(path)
    if not (p / _META).is_file():
        raise ConfigError(f"{p} is not a rollyard checkpoint (no {_META})")
    weights = load_file(str(p / "model.safetensors"))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise TrainError(f"checkpoint does not fit the model: missing={missing} unexpected={unexpected}")
    if optimizer is not None:
        optimizer.load_state_dict(torch.load(p / "optimizer.pt", weights_only=False))
    state = torch.load(p / "state.pt", weights_only=False)
    set_rng_state(state["rng"])
    return json.loads((p / _META).read_text()), state["extra_state"]


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
    tmp = _atomic_dir(final)
    model.save_pretrained(str(tmp), safe_serialization=True)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(tmp))
    (tmp / "rollyard_version.json").write_text(json.dumps({"version": version}))
    _commit_dir(tmp, final)
    return final
