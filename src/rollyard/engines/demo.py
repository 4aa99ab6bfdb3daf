"""A smoke run of the engine layer: tiny model -> real vLLM -> multi-turn token-id generation.

Each turn's prompt is the previous prompt + completion + the next user message's ids, which
is exactly how the gateway extends a conversation without re-tokenizing.
"""

from __future__ import annotations

from pathlib import Path

from rollyard.core.sampling import SamplingParams
from rollyard.engines import chat_template as ct
from rollyard.engines.launcher import VLLMServer
from rollyard.engines.tiny_model import create_model
from rollyard.engines.vllm import VLLMBackend

USER_TURNS = [
    "Find the value of key7 in data/ and write it to answer.txt.",
    "The file data/a.txt says key7=42. What next?",
    "Good. Now submit.",
]


async def run_engine_demo(workdir: Path, turns: int = 3) -> list[str]:
    from transformers import AutoTokenizer

    model_dir = workdir / "model"
    if not (model_dir / "config.json").exists():
        create_model(model_dir, seed=0, overwrite=True)
    tok = AutoTokenizer.from_pretrained(model_dir)
    lines = [f"model: {model_dir}"]
    with VLLMServer(model_dir, max_model_len=2048, log_path=workdir / "vllm.log") as server:
        lines.append(f"engine: {server.url} (log {server.log_path})")
        backend = VLLMBackend(server.url)
        try:
            system = ct.render_message({"role": "system", "content": "You are a helpful agent."}, first=True)
            ids = tok.encode(system, add_special_tokens=False)
            for i in range(turns):
                user = {"role": "user", "content": USER_TURNS[i % len(USER_TURNS)]}
                ids = ids + tok.encode(
                    ct.render_message(user) + ct.render_generation_prompt(), add_special_tokens=False
                )
                c = await backend.generate(ids, SamplingParams(max_tokens=24, temperature=1.0))
                lines.append(f"turn {i}: prompt_tokens={len(ids)} finish={c.finish_reason.value}")
                lines.append(f"  completion ids: {c.token_ids}")
                lines.append(f"  logprobs:       {[round(x, 3) for x in c.logprobs]}")
                lines.append(f"  text:           {tok.decode(c.token_ids)!r}")
                ids = ids + c.token_ids
                if c.token_ids[-1:] != [tok.eos_token_id]:  # close a truncated message
                    ids = ids + tok.encode(ct.IM_END, add_special_tokens=False)
            stats = await backend.stats()
            lines.append(f"engine stats: {stats.model_dump()}")
        finally:
            await backend.aclose()
    return lines
