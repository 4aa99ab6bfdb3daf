"""Forced tool calls on the real engine: the tokens the grammar forced are flagged in the journal,
and IPA's mismatch mask no longer drops the chunk that holds them (engine test)."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import torch
from tests.gateway.test_integration_vllm import ADMIN, gateway_url, program  # noqa: F401 (fixture)
from transformers import AutoModelForCausalLM

from rollyard.core.sample import Sample
from rollyard.core.trajectory import Segment, Trajectory
from rollyard.rl.losses import ipa_chunk_loss

pytestmark = pytest.mark.engine
BOUND = 1.0  # full.yaml's mismatch_bound
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}},
]


def _ipa_mask_frac(segment: Segment, trainer_lps: torch.Tensor) -> tuple[float, float]:
    """IPA's chunk mask fraction and loss for the segment as one chunk, the trainer's logprobs
    against the recorded ones (as ``train.objective`` passes them)."""
    s = Sample.from_segment(segment, 1.0)
    mask = torch.tensor(s.loss_mask, dtype=torch.float64)
    infer = torch.tensor(s.logprobs, dtype=torch.float64)
    lp = trainer_lps.to(torch.float64)
    forced = torch.tensor(s.forced, dtype=torch.bool) if s.forced is not None else None
    loss, m = ipa_chunk_loss(
        lp, lp.detach(), torch.ones_like(lp), mask, torch.zeros_like(mask, dtype=torch.long),
        infer_logprobs=infer, mismatch_bound=BOUND, forced=forced,
    )  # fmt: skip
    return m["chunk_mask_frac"], float(loss)


def test_forced_tool_call_tokens_are_flagged_and_do_not_mask_the_chunk(
    gateway_url: str,  # noqa: F811
    tiny_model_dir: Path,
) -> None:
    p = program(gateway_url, sampling={"temperature": 1.0, "max_tokens": 96})
    api = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=p["api_key"], max_retries=0)
    msgs = [{"role": "user", "content": "read the file"}]
    r = api.chat.completions.create(model="tiny", messages=msgs, tools=TOOLS, tool_choice="required")
    assert r.choices[0].message.tool_calls
    traj = Trajectory.model_validate(
        httpx.get(f"{gateway_url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
    )
    turn = traj.turns[0]
    n = len(turn.completion_ids)
    assert "constrained_decoding" in turn.flags and turn.forced == [(0, n)]
    # Why every token of the call and not only those at logprob 0 (the grammar's only admitted
    # token): the others were chosen among the few tokens the grammar admitted (another
    # tokenization of the wrapper, the tool, its arguments) and are recorded renormalised over them.
    exact = sum(lp == 0.0 for lp in turn.completion_logprobs)
    assert 0 < exact < n

    # The trainer's (unconstrained) logprobs of the same tokens, as a transformers forward pass.
    ids = turn.prompt_ids + turn.completion_ids
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float()
    lps = torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    trainer = torch.cat([torch.zeros(1), lps])
    start = len(turn.prompt_ids)
    gaps = [lp - float(trainer[start + i]) for i, lp in enumerate(turn.completion_logprobs)]
    assert sum(gaps) / n > BOUND  # recorded vs policy: the grammar, not staleness, makes the gap

    flagged = Segment(turns=[turn])
    unflagged = Segment(turns=[turn.model_copy(update={"forced": []})])
    frac, _ = _ipa_mask_frac(flagged, trainer)
    frac_unflagged, _ = _ipa_mask_frac(unflagged, trainer)
    assert frac_unflagged == 1.0  # as the issue saw it: the forced call's chunk was dropped
    assert frac == 0.0  # flagged: the chunk trains
