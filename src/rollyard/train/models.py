"""Named Llama-family model shapes, so tests, benchmarks and ``rollyard model init`` agree on sizes."""

from __future__ import annotations

from typing import Any

from rollyard.core.errors import ConfigError

# Shapes only; weights are random (seeded) or loaded from a directory.
_SIZES: dict[str, dict[str, int]] = {
    # ~0.3M params: property tests run hundreds of forwards.
    "test": {"vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2},
    # ~3.5M params: the engine's and the multi-turn benchmark's model.
    "tiny": {"vocab_size": 2048, "hidden_size": 256, "intermediate_size": 688, "num_hidden_layers": 4},
    # ~30M params: the group benchmark's model.
    "small": {"vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8},
}
_HEADS = {"test": (4, 2), "tiny": (4, 2), "small": (8, 4)}


def model_sizes() -> list[str]:
    return sorted(_SIZES)


def model_config_for(size: str, **overrides: Any) -> Any:
    """A ``LlamaConfig`` for a named size (fp32, tied embeddings, 2048 context); overrides win."""
    from transformers import LlamaConfig

    if size not in _SIZES:
        raise ConfigError(f"unknown model size {size!r}; known: {', '.join(model_sizes())}")
    heads, kv_heads = _HEADS[size]
    fields: dict[str, Any] = {
        **_SIZES[size],
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "tie_word_embeddings": True,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
    }
    fields.update(overrides)
    return LlamaConfig(**fields)


def build_model(size: str, *, seed: int = 0, attn: str = "sdpa", **overrides: Any) -> Any:
    """A randomly initialised fp32 ``LlamaForCausalLM`` of a named size, deterministic in ``seed``."""
    import torch
    from transformers import LlamaForCausalLM

    config = model_config_for(size, **overrides)
    config._attn_implementation = attn
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    return model
