"""The attach-time probe tells an engine that records the sampled distribution from one that
records the raw model's, and a run refuses the latter."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollyard.core.errors import EngineStartError
from rollyard.engines.logprob_mode import PROBE_T, classify, probe


def _top(logits: torch.Tensor, t: float) -> dict[str, float]:
    lp = torch.log_softmax(logits.double() / t, dim=-1)
    top = torch.topk(lp, 5)
    return {f"tok{int(i)}": float(v) for v, i in zip(top.values, top.indices, strict=True)}


@pytest.mark.parametrize("seed", range(5))
def test_the_probe_tells_processed_from_raw_logprobs(seed: int) -> None:
    logits = torch.randn(512, generator=torch.Generator().manual_seed(seed)) * 2
    at_one = _top(logits, 1.0)
    assert classify(at_one, _top(logits, PROBE_T), PROBE_T) == "processed_logprobs"
    assert classify(at_one, at_one, PROBE_T) == "raw_logprobs"  # the raw mode ignores T
    flat = {k: -6.0 for k in at_one}
    assert classify(flat, flat, PROBE_T) == "unknown"


@pytest.mark.engine
def test_a_run_accepts_a_processed_engine_and_refuses_a_raw_one(
    vllm_url: str, tiny_model_dir: Path, tmp_path: Path
) -> None:
    from rollyard.engines.launcher import VLLMServer
    from rollyard.rollout.services import check_logprob_mode

    assert probe(vllm_url) == "processed_logprobs"  # the session engine, started as a run starts its own
    check_logprob_mode(vllm_url)
    with VLLMServer(
        tiny_model_dir,
        kv_tokens=4096,
        max_model_len=512,
        served_name="tiny",
        log_path=tmp_path / "raw.log",
        extra_args=["--logprobs-mode", "raw_logprobs"],  # what `vllm serve` does by default
    ) as raw:
        assert probe(raw.url) == "raw_logprobs"
        with pytest.raises(EngineStartError, match="processed_logprobs"):
            check_logprob_mode(raw.url)
