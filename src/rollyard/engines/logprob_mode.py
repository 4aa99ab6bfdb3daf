"""Which distribution an attached vLLM's logprobs describe: the sampled one or the raw model's.

The trainer's importance ratios need the logprobs of the distribution that was sampled
(``--logprobs-mode processed_logprobs``); vLLM's default reports the raw model's (T = 1), which
at T = 0.7 was measured 0.49 nats off. vLLM does not publish its server arguments, so the probe
asks: one token's top-k logprobs for the same prompt at T = 1 and at T = 0.5. Scaling logits by
1/T preserves the top-k and multiplies every gap between two logprobs by 1/T under the processed
mode; under the raw mode the gaps do not change with T.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import httpx

from rollyard.core.errors import EngineStartError
from rollyard.engines.access import engine_http

Mode = Literal["processed_logprobs", "raw_logprobs", "unknown"]
PROCESSED: Mode = "processed_logprobs"
PROBE_T = 0.5
_PROMPT = [1, 2, 3, 4]  # token ids every vocabulary has
_TOP = 5


def classify(at_one: Mapping[str, float], at_t: Mapping[str, float], temperature: float) -> Mode:
    """The mode whose prediction the widest gap between two common top tokens matches."""
    common = sorted(set(at_one) & set(at_t), key=lambda k: at_one[k])
    if len(common) < 2:
        return "unknown"
    lo, hi = common[0], common[-1]
    gap_one = at_one[hi] - at_one[lo]
    gap_t = at_t[hi] - at_t[lo]
    if gap_one < 1e-3:  # a flat top-k says nothing
        return "unknown"
    tol = 1e-2 * gap_one / temperature + 1e-4
    if abs(gap_t - gap_one / temperature) <= tol:
        return PROCESSED
    if abs(gap_t - gap_one) <= tol:
        return "raw_logprobs"
    return "unknown"


def probe(url: str, *, timeout_s: float = 120.0) -> Mode:
    """Ask the engine at ``url`` (two one-token completions) which mode it runs."""
    base = url.rstrip("/")
    try:
        with engine_http(timeout=timeout_s) as client:
            model = client.get(f"{base}/v1/models").raise_for_status().json()["data"][0]["id"]
            tops = []
            for t in (1.0, PROBE_T):
                body = {
                    "model": model,
                    "prompt": _PROMPT,
                    "max_tokens": 1,
                    "temperature": t,
                    "logprobs": _TOP,
                }
                resp = client.post(f"{base}/v1/completions", json=body).raise_for_status().json()
                tops.append(resp["choices"][0]["logprobs"]["top_logprobs"][0])
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as e:
        raise EngineStartError(f"engine at {url}: logprob-mode probe failed: {e}") from e
    return classify(tops[0], tops[1], PROBE_T)
