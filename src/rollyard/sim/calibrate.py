"""``rollyard sim calibrate --engine URL``: fit an engine profile to a running vLLM.

Decode cost: B concurrent requests with random L-token prompts are run twice, to M1 and to
M2 output tokens (``ignore_eos``, fresh prompts each time so the prefix cache never helps;
sampled at temperature 1 with logprobs, as the gateway asks: ``GATEWAY_SAMPLING``);
(T(M2) - T(M1)) / (M2 - M1) is one decode step at batch B and context ~L. Prefill cost: one
request of L tokens and one output token. Least squares fits the step model of
``EngineProfile`` and its per-request cost (``request_s``: HTTP and admission, which only the
prefill timings carry; the decode differences cancel it); KV capacity comes from vLLM's
``cache_config_info`` metric.

``measure`` and ``profile_of`` are the two halves: several measurements (``Points``, added with
``+``) fit as one, which is how ``rollyard bench sim`` pools the quick calibrations it runs
between live runs into one profile with several times their points.
"""

from __future__ import annotations

import asyncio
import random
import re
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from rollyard.core.engine_key import engine_headers
from rollyard.core.errors import ConfigError, EngineUnavailable
from rollyard.sim.profile import EngineProfile, save_profile

__all__ = [
    "GATEWAY_SAMPLING",
    "Points",
    "calibrate",
    "fit",
    "fit_gateway",
    "fit_terms",
    "measure",
    "profile_of",
    "request_body",
]


async def _info(client: httpx.AsyncClient) -> dict[str, Any]:
    models = (await client.get("/v1/models")).json()["data"][0]
    metrics = (await client.get("/metrics")).text
    m = re.search(r"vllm:cache_config_info\{([^}]*)\}", metrics)
    if m is None:
        raise EngineUnavailable("the engine's /metrics has no vllm:cache_config_info; is it vLLM?")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
    return {
        "model": models["id"],
        "max_model_len": int(models.get("max_model_len") or 2048),
        "num_blocks": int(labels["num_gpu_blocks"]),
        "block_size": int(labels["block_size"]),
    }


# What the gateway sends vLLM for a program's turn (``VLLMBackend.completion_body`` with the
# default sampling at temperature 1, as RL rollouts run): sampled, with the chosen token's
# logprob, its ids as ``"token_id:N"`` tokens (not ``return_token_ids``, which also echoes the
# prompt's ids). Greedy decoding without logprobs, what calibration used to
# ask for, skips the sampler's softmax over the vocabulary, a large share of a tiny model's
# step on a CPU, so its profile was too fast for the live runs it was meant to predict.
GATEWAY_SAMPLING: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": -1,
    "logprobs": 0,
    "return_tokens_as_token_ids": True,
    "skip_special_tokens": False,
}


def request_body(model: str, prompt: list[int], out: int) -> dict[str, Any]:
    """A timing request: the gateway's shape, exactly ``out`` output tokens."""
    return {"model": model, "prompt": prompt, "max_tokens": out, "min_tokens": out, "ignore_eos": True,
            "stream": False, **GATEWAY_SAMPLING}  # fmt: skip


async def _batch(
    client: httpx.AsyncClient, model: str, rng: random.Random, b: int, length: int, out: int
) -> float:
    """Wall seconds for b concurrent requests of ``length`` random prompt tokens, ``out`` outputs each."""

    async def one() -> None:
        prompt = [rng.randrange(10, 1000) for _ in range(length)]
        r = await client.post("/v1/completions", json=request_body(model, prompt, out))
        r.raise_for_status()
        got = r.json()["usage"]["completion_tokens"]
        if got != out:
            raise EngineUnavailable(f"asked for {out} tokens, the engine produced {got}")

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(b)))
    return time.perf_counter() - t0


def fit(decode: list[tuple[int, float, float]], prefill: list[tuple[int, float]]) -> dict[str, float]:
    """Least squares over both kinds of timing; negative terms are dropped and refitted.

    ``decode``: (batch, mean context, seconds per step); ``prefill``: (prompt tokens, seconds).
    Unknowns: overhead, per_token, decode_attn, prefill_attn, request (HTTP, prefill rows only).
    """
    rows, ys = [], []
    for b, ctx, s in decode:
        rows.append([1.0, b, b * ctx, 0.0, 0.0])
        ys.append(s)
    for n, s in prefill:
        rows.append([1.0, n, 0.0, n * (n + 1) / 2, 1.0])
        ys.append(s)
    names = ["overhead_s", "per_token_s", "decode_attn_s", "prefill_attn_s", "request_s"]
    return fit_terms(rows, ys, names)


def fit_terms(rows: list[list[float]], ys: list[float], names: list[str]) -> dict[str, float]:
    """Non-negative least squares on relative error: a term the timings make negative is
    dropped and the rest refitted. Returns each name's coefficient and ``max_rel_err``."""
    a, y = np.array(rows), np.array(ys)
    w = 1.0 / y  # relative error: small and large timings count alike
    keep = list(range(a.shape[1]))
    while True:
        coef, *_ = np.linalg.lstsq(a[:, keep] * w[:, None], y * w, rcond=None)
        neg = [k for k, c in zip(keep, coef, strict=True) if c < 0]
        if not neg:
            break
        keep.remove(neg[0])
    full = dict.fromkeys(range(a.shape[1]), 0.0)
    full.update({k: float(c) for k, c in zip(keep, coef, strict=True)})
    pred = a @ np.array([full[k] for k in range(a.shape[1])])
    out = {names[k]: full[k] for k in range(a.shape[1])}
    out["max_rel_err"] = float(np.max(np.abs(pred - y) / y))
    return out


def fit_gateway(points: list[tuple[float, float, float, bool, float]]) -> dict[str, float]:
    """The gateway's CPU per request, ``(prompt tokens, new tokens, output tokens, streamed, CPU
    s)`` each, fitted to ``GatewayCost``'s terms: a fixed part, per prompt token, per new token
    (what the request added to its conversation), per output token answered whole and per
    output token streamed."""
    rows = [[1.0, p, n, 0.0 if s else o, o if s else 0.0] for p, n, o, s, _ in points]
    names = ["base_s", "per_prompt_token_s", "per_new_token_s", "per_output_token_s", "per_stream_token_s"]
    return fit_terms(rows, [c for *_, c in points], names)


@dataclass(frozen=True)
class Points:
    """One engine's timing points: ``decode`` (batch, mean context, s/step), ``prefill``
    (prompt tokens, s), and what its ``/metrics`` and ``/v1/models`` said (``info``)."""

    info: dict[str, Any]
    decode: list[tuple[int, float, float]] = field(default_factory=list)
    prefill: list[tuple[int, float]] = field(default_factory=list)

    def __add__(self, other: Points) -> Points:
        """Both measurements' points, for one fit (of the same engine: ``info`` must agree)."""
        if other.info != self.info:
            raise ConfigError(f"cannot pool calibrations of different engines: {self.info} vs {other.info}")
        return Points(self.info, self.decode + other.decode, self.prefill + other.prefill)


async def _measure(url: str, quick: bool, seed: int) -> Points:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=url.rstrip("/"), timeout=600.0, headers=engine_headers()) as client:
        try:
            info = await _info(client)
        except httpx.HTTPError as e:
            raise EngineUnavailable(f"cannot reach the engine at {url}: {e}") from None
        model, m1, m2 = info["model"], 8, 72
        top = info["max_model_len"] - m2 - 1
        batches = [1, 8, 32] if quick else [1, 4, 16, 48]
        # 384: a full batch with mid contexts, where agent workloads on a small cache run (32 x
        # 456 tokens fill 14.6k of a 16k cache). Without it the quick points reached a context
        # sum of 8.5k only, and the fit under-predicted such steps by 15-49% in one calibration.
        lengths = [min(top, n) for n in ([64, 384, 1024] if quick else [64, 512, 1536])]
        await _batch(client, model, rng, 2, 16, 4)  # warm-up
        decode = []
        for b in batches:
            for n in lengths:
                if b * (n + m2) > info["num_blocks"] * info["block_size"]:
                    continue  # would preempt: not a clean step timing
                steps = []
                for _ in range(3):  # paired runs, the median of their differences (shared, noisy cores)
                    t1 = await _batch(client, model, rng, b, n, m1)
                    t2 = await _batch(client, model, rng, b, n, m2)
                    steps.append((t2 - t1) / (m2 - m1))
                decode.append((b, n + (m1 + m2) / 2, max(1e-6, statistics.median(steps))))
        prefill = []
        for n in [16, 256, 1024] if quick else [16, 128, 512, 1024, 1536]:
            n = min(top, n)
            runs = [await _batch(client, model, rng, 1, n, 1) for _ in range(3)]
            prefill.append((n, statistics.median(runs)))
    return Points(info, decode, prefill)


def measure(url: str, *, quick: bool = False, seed: int = 0) -> Points:
    """Time the engine at ``url`` (``quick``: 3 batch sizes x 3 contexts, 3 prefill lengths)."""
    return asyncio.run(_measure(url, quick, seed))


def profile_of(
    points: Points, *, name: str, url: str, max_num_seqs: int = 128, max_batched_tokens: int = 2048
) -> tuple[EngineProfile, str]:
    """The fitted profile and a comment that records the points and the fit (the file's header)."""
    info, decode, prefill = points.info, points.decode, points.prefill
    coef = fit(decode, prefill)
    if coef["overhead_s"] <= 0 and coef["per_token_s"] <= 0:
        raise ConfigError(f"calibration of {url} gave no usable fit: {coef}")
    profile = EngineProfile(
        name=name,
        source=f"rollyard sim calibrate against {info['model']} at {url}, {time.strftime('%Y-%m-%d')}",
        overhead_s=coef["overhead_s"],
        per_token_s=coef["per_token_s"],
        decode_attn_s=coef["decode_attn_s"],
        prefill_attn_s=coef["prefill_attn_s"],
        request_s=coef["request_s"],
        block_size=info["block_size"],
        num_blocks=info["num_blocks"],
        max_num_seqs=max_num_seqs,
        max_batched_tokens=max_batched_tokens,
        max_model_len=info["max_model_len"],
    )
    lines = [
        f"measured: {info}",
        f"fit: {coef}",
        "decode points (batch, context, s/step): "
        + ", ".join(f"({b},{c:.0f},{s:.4f})" for b, c, s in decode),
        "prefill points (tokens, s): " + ", ".join(f"({n},{s:.4f})" for n, s in prefill),
    ]
    return profile, "\n".join(lines)


def calibrate(
    url: str,
    *,
    name: str,
    path: Path,
    quick: bool = False,
    seed: int = 0,
    max_num_seqs: int = 128,
    max_batched_tokens: int = 2048,
) -> EngineProfile:
    """Measure the engine at ``url``, fit, and write the profile to ``path``. The batch limits
    are not visible from outside vLLM: pass the engine's (defaults: vLLM's CPU server defaults)."""
    points = measure(url, quick=quick, seed=seed)
    profile, comment = profile_of(
        points, name=name, url=url, max_num_seqs=max_num_seqs, max_batched_tokens=max_batched_tokens
    )
    save_profile(profile, path, comment)
    return profile
