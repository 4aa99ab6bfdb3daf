"""A vLLM general plugin (entry point ``vllm.general_plugins: rollyard``): fixes, inside the
engine process, vLLM bugs that corrupt what rollyard's runs sample.

vLLM loads general plugins in every engine process right before the CPU platform registers
its C++ stand-ins for the Triton kernels it cannot run, and that registration reads the
stand-ins from ``vllm.utils.cpu_triton_utils`` at that moment, so replacing one there is enough.

The fix: on CPU, ``expand_batch_to_tokens`` (which spreads each request's temperature, top-k
and top-p over its draft tokens before speculative verification) calls a stand-in that hands
the C++ kernel an int64 *copy* of its float output buffer and never copies back, so verification
divides the logits by uninitialised memory (and would truncate 0.7 to 0 if it did copy back).
Every speculative run at T > 0 on CPU then accepts almost no draft token past the first and
samples its corrections from a garbage distribution (vLLM issue 55005, open upstream).
Measured here before the fix: accepted tokens per draft position 0.12, 0.003, 0, 0.

The second: with a speculative config every step goes through the rejection sampler, also a
step where no request has a draft (a prefill, or a drafter with nothing to propose); on CPU a
request with ``top_k`` set and no ``top_p`` then reaches ``apply_top_k_only`` with no rows, whose
``k.max()`` raises and kills the engine. An empty batch has nothing to mask, so it returns as is.

Imports nothing from rollyard: it runs in the engine before anything else of ours.
"""

from __future__ import annotations

from typing import Any


def register() -> None:
    """Install the fixes (idempotent: vLLM may load plugins more than once per process)."""
    try:
        from vllm.utils import cpu_triton_utils
    except ImportError:  # a vLLM without the CPU stand-ins: nothing to fix
        return
    cpu_triton_utils._expand_kernel_impl = expand_kernel_impl  # type: ignore[attr-defined]
    from vllm.v1.sample.ops import topk_topp_sampler

    original = topk_topp_sampler.apply_top_k_only
    if getattr(original, "_rollyard", False):
        return

    def apply_top_k_only(logits: Any, k: Any) -> Any:
        return logits if k.numel() == 0 else original(logits, k)

    apply_top_k_only._rollyard = True  # type: ignore[attr-defined]
    topk_topp_sampler.apply_top_k_only = apply_top_k_only


def expand_kernel_impl(
    output: Any,
    input_val: Any,
    cu_num_tokens: Any,
    replace_from: float,
    replace_to: float,
    MAX_NUM_TOKENS: int | None = None,
) -> None:
    """``output[cu[i-1]:cu[i]] = input_val[i]`` (``replace_from`` read as ``replace_to``), in
    the buffer's own dtype: what vLLM's Triton ``expand_kernel`` does."""
    import torch

    ends = cu_num_tokens.to(torch.int64)
    counts = torch.diff(ends, prepend=ends.new_zeros(1))
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)
    output[: expanded.numel()].copy_(expanded.to(output.dtype))
