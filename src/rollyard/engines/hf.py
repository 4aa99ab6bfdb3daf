"""``HFBackend``: the Backend protocol in-process with transformers, for tests without a server.

Requests run one at a time in a worker thread (a baseline, not a serving engine). Logprobs
are of the raw model distribution (before temperature / top-p), as vLLM reports them by
default, so the two backends can be compared token by token.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from rollyard.core.errors import ContextLengthExceeded, EngineUnavailable, InvalidRequest
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Completion, CompletionDelta, EngineStats
from rollyard.engines.tiny_model import check_model_dir

log = logging.getLogger(__name__)


class HFBackend:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        name: str = "hf",
        max_model_len: int = 2048,
        threads: int | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        check_model_dir(model_dir)
        if threads:
            torch.set_num_threads(threads)
        self.name = name
        self.max_model_len = max_model_len
        self.model_dir = Path(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        tok = AutoTokenizer.from_pretrained(model_dir)
        self.eos_ids = {tok.eos_token_id} if tok.eos_token_id is not None else set()
        self._version = 0
        self._lock = asyncio.Lock()
        self._closed = False
        self._paused = asyncio.Event()
        self._paused.set()
        self._aborted = False
        self._served = 0

    @property
    def policy_version(self) -> int:
        return self._version

    def _check(self, prompt_ids: list[int], params: SamplingParams) -> int:
        if self._closed:
            raise EngineUnavailable(f"engine {self.name} is closed")
        if not prompt_ids:
            raise InvalidRequest("empty prompt")
        if params.constrained:
            raise InvalidRequest("HFBackend does not support structured outputs (regex or grammar)")
        if len(prompt_ids) >= self.max_model_len:
            raise ContextLengthExceeded(
                f"prompt of {len(prompt_ids)} tokens does not fit the context of {self.max_model_len}"
            )
        return min(params.max_tokens, self.max_model_len - len(prompt_ids))

    def _decode_steps(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int) -> Any:
        """Yield (token id, raw logprob) pairs; the generator owns the KV cache."""
        import torch

        gen = torch.Generator().manual_seed(params.seed if params.seed is not None else torch.seed() % 2**31)
        stops = self.eos_ids | set(params.stop_token_ids)
        with torch.no_grad():
            out = self.model(torch.tensor([prompt_ids]), use_cache=True)
            past = out.past_key_values
            logits = out.logits[0, -1]
            for _ in range(max_tokens):
                raw = torch.log_softmax(logits.float(), dim=-1)
                tok = self._sample(logits.float(), params, gen)
                yield tok, float(raw[tok])
                if tok in stops or self._aborted:
                    return
                out = self.model(torch.tensor([[tok]]), past_key_values=past, use_cache=True)
                past = out.past_key_values
                logits = out.logits[0, -1]

    @staticmethod
    def _sample(logits: Any, params: SamplingParams, gen: Any) -> int:
        import torch

        if params.temperature == 0.0:
            return int(torch.argmax(logits))
        scaled = logits / params.temperature
        if params.top_k > 0:
            kth = torch.topk(scaled, min(params.top_k, scaled.numel())).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if params.top_p < 1.0:
            sorted_p, idx = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p
            mask = torch.zeros_like(probs, dtype=torch.bool).scatter(0, idx, keep)
            probs = probs.masked_fill(~mask, 0.0)
            probs = probs / probs.sum()
        return int(torch.multinomial(probs, 1, generator=gen))

    def _run(self, prompt_ids: list[int], params: SamplingParams, max_tokens: int) -> Completion:
        ids: list[int] = []
        lps: list[float] = []
        for tok, lp in self._decode_steps(prompt_ids, params, max_tokens):
            ids.append(tok)
            lps.append(lp)
        stopped = bool(ids) and (ids[-1] in self.eos_ids or ids[-1] in params.stop_token_ids)
        reason = (
            FinishReason.ABORT if self._aborted else FinishReason.STOP if stopped else FinishReason.LENGTH
        )
        return Completion(
            token_ids=ids,
            logprobs=lps,
            finish_reason=reason,
            prompt_tokens=len(prompt_ids),
            policy_version=self._version,
            engine=self.name,
        )

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        max_tokens = self._check(prompt_ids, params)
        await self._paused.wait()
        async with self._lock:
            self._aborted = False
            result = await asyncio.to_thread(self._run, prompt_ids, params, max_tokens)
            self._served += 1
            return result

    async def stream(self, prompt_ids: list[int], params: SamplingParams) -> AsyncIterator[CompletionDelta]:
        # The in-process baseline computes the whole completion, then streams it token by
        # token; what matters for tests is that the deltas concatenate to the same ids.
        result = await self.generate(prompt_ids, params)
        n = len(result.token_ids)
        for i, (tok, lp) in enumerate(zip(result.token_ids, result.logprobs, strict=True)):
            yield CompletionDelta(
                token_ids=[tok],
                logprobs=[lp],
                finish_reason=result.finish_reason if i == n - 1 else None,
                prompt_tokens=result.prompt_tokens,
                policy_version=result.policy_version,
            )
        if n == 0:
            yield CompletionDelta(finish_reason=result.finish_reason, prompt_tokens=result.prompt_tokens)

    async def stats(self) -> EngineStats:
        if self._closed:
            raise EngineUnavailable(f"engine {self.name} is closed")
        return EngineStats(kv_capacity_tokens=self.max_model_len, running=int(self._lock.locked()))

    async def health(self) -> bool:
        return not self._closed

    async def pause(self) -> None:
        self._paused.clear()

    async def resume(self) -> None:
        self._paused.set()

    async def abort(self, request_ids: list[str] | None = None) -> None:
        self._aborted = True

    async def reset_prefix_cache(self) -> None:
        """No cross-request cache exists in-process; nothing to reset."""

    async def load_weights(self, path: str, version: int) -> None:
        from safetensors.torch import load_file

        files = sorted(Path(path).glob("*.safetensors"))
        if not files:
            raise InvalidRequest(f"no safetensors weights in {path}")
        state: dict[str, Any] = {}
        for f in files:
            state.update(load_file(str(f)))
        async with self._lock:
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            real_missing = [m for m in missing if not m.endswith("lm_head.weight")]  # tied
            if real_missing or unexpected:
                raise InvalidRequest(
                    f"weights do not match the model: missing={real_missing} unexpected={unexpected}"
                )
            self.model.tie_weights()
            self._version = version

    async def aclose(self) -> None:
        self._closed = True
