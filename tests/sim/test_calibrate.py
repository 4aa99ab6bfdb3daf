"""The calibration fit recovers a known step model from its own timings."""

from __future__ import annotations

import pytest

from rollyard.core.errors import ConfigError
from rollyard.core.sampling import SamplingParams
from rollyard.engines.vllm import VLLMBackend
from rollyard.sim.calibrate import Points, fit, profile_of, request_body


def test_fit_recovers_the_step_model_it_was_given() -> None:
    o, t, d, p, req = 0.01, 2e-4, 3e-6, 1e-7, 0.05
    decode = [(b, c, o + t * b + d * b * c) for b in (1, 4, 16, 48) for c in (104, 552, 1576)]
    prefill = [(n, req + o + t * n + p * n * (n + 1) / 2) for n in (16, 128, 512, 1024, 1536)]
    got = fit(decode, prefill)
    assert got["overhead_s"] == pytest.approx(o, rel=1e-6)
    assert got["per_token_s"] == pytest.approx(t, rel=1e-6)
    assert got["decode_attn_s"] == pytest.approx(d, rel=1e-6)
    assert got["prefill_attn_s"] == pytest.approx(p, rel=1e-6)
    assert got["request_s"] == pytest.approx(req, rel=1e-6)
    assert got["max_rel_err"] < 1e-9


def test_a_term_the_timings_contradict_is_dropped_not_negative() -> None:
    decode = [(b, c, 0.02 + 1e-4 * b) for b in (1, 8, 32) for c in (100, 1000)]
    prefill = [(n, 0.02 + 1e-4 * n) for n in (16, 256, 1024)]
    got = fit(decode, prefill)
    assert min(v for k, v in got.items() if k != "max_rel_err") >= 0.0
    assert got["per_token_s"] == pytest.approx(1e-4, rel=1e-3)


async def test_timing_requests_have_the_gateways_shape() -> None:
    # temperature 1 and the chosen token's logprob, as the gateway forwards a program's turn:
    # a greedy request without logprobs skips the sampler's work and times a faster engine
    backend = VLLMBackend("http://127.0.0.1:1", model="tiny", max_model_len=2048)
    try:
        gateway = await backend.completion_body([5, 6, 7], SamplingParams(max_tokens=4, ignore_eos=True))
    finally:
        await backend.aclose()
    ours = request_body("tiny", [5, 6, 7], 4)
    assert ours.pop("min_tokens") == 4
    assert ours == gateway
    assert ours["temperature"] == 1.0 and ours["logprobs"] == 0


def test_pooled_calibrations_fit_as_one_over_all_their_points() -> None:
    # two noisy quick calibrations of one engine: pooled, the fit is that of all the points
    info = {"model": "tiny", "max_model_len": 2048, "num_blocks": 256, "block_size": 64}
    o, t = 0.01, 2e-4
    a = Points(info, [(b, 100.0, (o + t * b) * 1.2) for b in (1, 8, 32)], [(16, 0.02), (256, 0.07)])
    b = Points(info, [(b, 1000.0, (o + t * b) * 0.8) for b in (1, 8, 32)], [(1024, 0.25)])
    pooled = a + b
    assert pooled.decode == a.decode + b.decode and pooled.prefill == a.prefill + b.prefill
    profile, comment = profile_of(pooled, name="pooled", url="http://127.0.0.1:1")
    assert profile.num_blocks == 256 and profile.block_size == 64
    assert "(32,1000," in comment  # the file's header records every point it was fitted to


def test_calibrations_of_different_engines_do_not_pool() -> None:
    info = {"model": "tiny", "max_model_len": 2048, "num_blocks": 256, "block_size": 64}
    with pytest.raises(ConfigError, match="different engines"):
        Points(info) + Points({**info, "num_blocks": 64})
