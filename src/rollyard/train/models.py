"""Random seeded models for tests and benchmarks.

The named sizes (``tiny``, ``small``) are defined once, in ``rollyard.engines.tiny_model``; the
trainer adds only ``test``, a ~0.1M-parameter shape that property tests can forward hundreds of
times.
"""

from __future__ import annotations

from typing import Any

from rollyard.core.errors import ConfigError

_TEST = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "tie_word_embeddings": True,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
}


def model_sizes() -> list[str]:
    from rollyard.engines.tiny_model import SIZES

    return sorted([*SIZES, "test"])


def model_config_for(size: str, **overrides: Any) -> Any:
    """A ``LlamaConfig`` for a named size; ``overrides`` are set on it afterwards."""
    from transformers import LlamaConfig

    from rollyard.engines.tiny_model import SIZES
    from rollyard.engines.tiny_model import model_config_for as engine_config

    if size == "test":
        config = LlamaConfig(**_TEST)
    elif size in SIZES:
        config = engine_config(size)
    else:
        raise ConfigError(f"unknown model size {size!r}; known: {', '.join(model_sizes())}")
    for k, v in overrides.items():
        setattr(config, k, v)
    return config


def build_model(size: str, *, seed: int = 0, attn: str = "sdpa", **overrides: Any) -> Any:
    """A randomly initialised fp32 causal LM of a named size, deterministic in ``seed``."""
    import torch
    from transformers import AutoModelForCausalLM

    config = model_config_for(size, **overrides)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config).to(torch.float32)
