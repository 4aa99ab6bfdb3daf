"""Create a small Llama-family model with its own tokenizer, without downloading anything.

The tokenizer is a byte-level BPE trained on text that ships with every Python install (a
fixed, sorted slice of the standard library's sources) plus a synthetic corpus in the chat
format, so tool-call JSON tokenizes compactly. Weights are random (seeded). The result is a
plain HF directory (safetensors) that vLLM and transformers both load.
"""

from __future__ import annotations

import json
import logging
import random
import sysconfig
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

from rollyard.core.atomic import replace_dir
from rollyard.core.errors import ConfigError
from rollyard.engines import chat_template as ct

log = logging.getLogger(__name__)

Size = Literal["tiny", "small"]

# name -> (vocab, hidden, layers, heads, kv heads, intermediate)
SIZES: dict[str, tuple[int, int, int, int, int, int]] = {
    "tiny": (2048, 256, 4, 4, 2, 704),  # ~3.5M parameters
    "small": (4096, 512, 8, 8, 4, 1408),  # ~26M parameters: KV pressure and real training cost
}
# Positions cost nothing with RoPE (no learned table), so the default leaves room for the prompts
# of real agent CLIs (Claude Code's is ~31.6k tiny-model tokens); KV memory follows kv_tokens.
MAX_POSITIONS = 65536
_CORPUS_BYTES = 3_000_000


def model_config_for(
    size: str, vocab_size: int | None = None, max_context: int = MAX_POSITIONS
):  # -> LlamaConfig
    """The Llama config of a named size; the one place sizes are defined."""
    from transformers import LlamaConfig

    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    vocab, hidden, layers, heads, kv, inter = SIZES[size]
    return LlamaConfig(
        vocab_size=vocab_size or vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        max_position_embeddings=max_context,
        tie_word_embeddings=True,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        dtype="float32",
    )


def _stdlib_texts(limit: int) -> Iterator[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    total = 0
    for path in sorted(root.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        total += len(text)
        yield text
        if total >= limit:
            return


def _chat_corpus(seed: int, n: int = 3000) -> Iterator[str]:
    """Synthetic conversations in the chat format: roles, tool calls and shell-ish output."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "key", "value", "answer", "data", "file", "notes", "config"]
    tools = [
        {"name": "bash", "description": "Run a shell command.", "parameters": {"command": "string"}},
        {"name": "read_file", "description": "Read a file.", "parameters": {"path": "string"}},
        {"name": "write_file", "description": "Write a file.", "parameters": {"path": "string"}},
        {"name": "submit", "description": "Finish the task.", "parameters": {}},
    ]
    for _ in range(n):
        key = rng.choice(words) + str(rng.randint(0, 99))
        val = rng.choice(words) + str(rng.randint(0, 999))
        path = f"data/{rng.choice(words)}{rng.randint(0, 9)}.txt"
        msgs = [
            {"role": "system", "content": "You are a helpful agent. Use the tools."},
            {"role": "user", "content": f"Find the value of {key} and write it to answer.txt."},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "bash", "arguments": {"command": f"grep -r {key} data"}}}
                ],
            },
            {"role": "tool", "content": f"{path}:{key}={val}\n"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"function": {"name": "write_file", "arguments": {"path": "answer.txt", "content": val}}}
                ],
            },
            {"role": "tool", "content": "ok"},
            {"role": "assistant", "content": f"The value of {key} is {val}."},
        ]
        yield ct.render_conversation(msgs, tools=tools, add_generation_prompt=False)


def build_tokenizer(
    vocab_size: int, seed: int, max_context: int = MAX_POSITIONS
):  # -> PreTrainedTokenizerFast
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=ct.SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )

    def corpus() -> Iterator[str]:
        yield from _stdlib_texts(_CORPUS_BYTES)
        yield from _chat_corpus(seed)

    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=None,
        eos_token=ct.IM_END,
        pad_token=ct.PAD,
        unk_token=None,
        additional_special_tokens=[ct.IM_START],
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(ct.ADDED_TOKENS)  # not special: decode keeps them, the parser sees them
    fast.chat_template = ct.CHAT_TEMPLATE
    fast.model_max_length = max_context
    return fast


def create_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    size: str = "tiny",
    overwrite: bool = False,
    max_context: int = MAX_POSITIONS,
) -> Path:
    """Write tokenizer + config + random weights to ``out_dir`` atomically; return the path.
    ``max_context`` is the model's position limit, which engines serving it may not exceed."""
    import torch
    from transformers import GenerationConfig, LlamaForCausalLM

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"{out} exists and is not empty (pass overwrite to replace it)")
    if size not in SIZES:
        raise ConfigError(f"unknown model size {size!r}; choose one of {sorted(SIZES)}")
    if max_context < 128:
        raise ConfigError(f"max_context={max_context} is too small for a chat model (>= 128)")
    tokenizer = build_tokenizer(SIZES[size][0], seed, max_context)
    config = model_config_for(size, vocab_size=len(tokenizer), max_context=max_context)
    config.eos_token_id = tokenizer.convert_tokens_to_ids(ct.IM_END)
    config.pad_token_id = tokenizer.convert_tokens_to_ids(ct.PAD)
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id, bos_token_id=None
    )

    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        (tmp / "rollyard.json").write_text(
            json.dumps({"size": size, "seed": seed, "policy_version": 0, "params": model.num_parameters()})
        )

    replace_dir(out, fill)
    log.info("created model size=%s seed=%d params=%d dir=%s", size, seed, model.num_parameters(), out)
    return out


def check_model_dir(path: str | Path) -> Path:
    """Fail early, with one clear line, on a missing or corrupt model directory."""
    p = Path(path)
    if not p.is_dir():
        raise ConfigError(f"model directory {p} does not exist (create one: rollyard model init {p})")
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        f = p / name
        if not f.is_file():
            raise ConfigError(f"model directory {p} has no {name}")
        if name.endswith(".json"):
            try:
                json.loads(f.read_text())
            except (ValueError, OSError) as e:
                raise ConfigError(f"model directory {p}: {name} is corrupt: {e}") from e
    if not list(p.glob("*.safetensors")):
        raise ConfigError(f"model directory {p} has no *.safetensors weights")
    return p


def model_positions(path: str | Path) -> int | None:
    """The model's position limit (``max_position_embeddings``), or None when it does not say."""
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return None
    n = config.get("max_position_embeddings")
    return int(n) if isinstance(n, int) and n > 0 else None
