"""Chunked LM-head logprobs equal the full-logits path (fp32, 1e-6), for logprobs, entropy and every
parameter gradient, on random forests; and the trainer takes the chunked path by default."""

from __future__ import annotations

import functools
import logging
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core import Sample
from rollyard.train import TrainConfig, Trainer, build_model, pack_samples, set_attention
from rollyard.train.logprobs import chunk_blocker, micro_batch_logprobs
from rollyard.train.objective import LossConfig
from rollyard.train.step import forward_backward

VOCAB = 512


@functools.cache
def _model(tied: bool) -> torch.nn.Module:
    torch.set_num_threads(2)
    model = build_model("test", seed=2, tie_word_embeddings=tied)
    if not tied:  # an untied head of its own
        model.lm_head.weight = torch.nn.Parameter(torch.randn(VOCAB, 64) * 0.05)
    set_attention(model, "rollyard_tree")
    return model


@st.composite
def forests(draw: st.DrawFn) -> list[Sample]:
    """Samples branching off random prefixes of earlier ones (a narrow alphabet merges them more)."""
    rng = random.Random(draw(st.integers(0, 2**31)))
    alphabet = draw(st.sampled_from([4, VOCAB]))
    seqs: list[list[int]] = [[rng.randrange(alphabet) for _ in range(rng.randint(2, 14))]]
    for _ in range(draw(st.integers(0, 5))):
        base = rng.choice(seqs)
        seqs.append(
            base[: rng.randint(0, len(base))] + [rng.randrange(alphabet) for _ in range(rng.randint(1, 9))]
        )
    return [
        Sample(
            token_ids=s,
            loss_mask=[0] + [1] * (len(s) - 1),
            logprobs=[-rng.random() * 3 for _ in s],
            advantages=[rng.gauss(0, 1) for _ in s],
        )
        for s in seqs
    ]


def _run(model: torch.nn.Module, samples: list[Sample], chunk: int, temperature: float) -> tuple:
    model.zero_grad(set_to_none=True)
    packed = pack_samples(samples, token_budget=24)
    res = forward_backward(
        model,
        samples,
        packed,
        LossConfig(kind="sft"),
        "rollyard_tree",
        keep_logprobs=True,
        temperature=temperature,
        logits_chunk=chunk,
    )
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return res, grads


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(), st.integers(1, 40), st.sampled_from([1.0, 0.6, 1.7]), st.booleans())
def test_chunked_head_equals_full_logits(
    samples: list[Sample], chunk: int, temperature: float, tied: bool
) -> None:
    model = _model(tied)
    full, g_full = _run(model, samples, 0, temperature)
    chunked, g_chunked = _run(model, samples, chunk, temperature)
    for i, lp in full.logprobs.items():
        assert float((chunked.logprobs[i] - lp).abs().max()) <= 1e-6, f"sample {i} logprobs differ"
    assert chunked.loss == pytest.approx(full.loss, abs=1e-6)
    # entropy is a no-grad metric of magnitude ~log V: equal to fp32 rounding (relative 1e-6)
    assert chunked.metrics["entropy"] == pytest.approx(full.metrics["entropy"], rel=1e-6)
    assert g_chunked.keys() == g_full.keys()
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    assert float(g_chunked[head].abs().max()) > 0, "the head weight got no gradient"
    # a weight's gradient sums over every row in another order (per chunk, then across chunks):
    # fp32 summation order, seen at 1.2x of 1e-6 relative on a tied embedding; 1e-5 bounds it
    for name, g in g_full.items():
        assert float((g_chunked[name] - g).abs().max()) <= 1e-5 * max(1.0, float(g.abs().max())), name


@pytest.mark.parametrize("family", ["Qwen2", "Qwen3"])
def test_chunked_head_on_other_families(family: str) -> None:
    import transformers

    config = getattr(transformers, f"{family}Config")(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = getattr(transformers, f"{family}ForCausalLM")(config).float()
    set_attention(model, "rollyard_tree")
    assert chunk_blocker(model) is None
    rng = random.Random(1)
    prompt = [rng.randrange(300) for _ in range(9)]
    samples = [
        Sample(token_ids=prompt + c, loss_mask=[0] * 9 + [1] * 5, logprobs=[-1.0] * 14, advantages=[1.0] * 14)
        for c in ([rng.randrange(300) for _ in range(5)] for _ in range(3))
    ]
    full, g_full = _run(model, samples, 0, 1.0)
    chunked, g_chunked = _run(model, samples, 4, 1.0)
    for i, lp in full.logprobs.items():
        assert float((chunked.logprobs[i] - lp).abs().max()) <= 1e-6
    assert float(g_chunked["lm_head.weight"].abs().max()) > 0
    # a weight's gradient sums over every row in another order (per chunk, then across chunks):
    # fp32 summation order, seen at 1.2x of 1e-6 relative on a tied embedding; 1e-5 bounds it
    for name, g in g_full.items():
        assert float((g_chunked[name] - g).abs().max()) <= 1e-5 * max(1.0, float(g.abs().max())), name


def test_head_with_extras_falls_back_to_full_logits(caplog: pytest.LogCaptureFixture) -> None:
    model = build_model("test", seed=3, final_logit_softcapping=30.0)
    set_attention(model, "rollyard_tree")
    assert "final_logit_softcapping" in (chunk_blocker(model) or "")
    one = Sample(token_ids=[5, 6, 7, 8], loss_mask=[0, 1, 1, 1], logprobs=[0.0] * 4, advantages=[1.0] * 4)
    mb = pack_samples([one]).micro_batches[0]
    shapes: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.shape)))
    with caplog.at_level(logging.WARNING):
        micro_batch_logprobs(model, mb, "rollyard_tree", {"attention_mask": None}, chunk=64)
    assert shapes == [(1, 4, VOCAB)], "the fallback computes the full logits"
    assert "full (L, V) logits" in caplog.text


def test_trainer_takes_the_chunked_head_by_default(group) -> None:  # type: ignore[no-untyped-def]
    model = build_model("test", seed=4)
    shapes: list[tuple[int, ...]] = []
    model.lm_head.register_forward_hook(lambda _m, _a, out: shapes.append(tuple(out.shape)))
    before = model.model.embed_tokens.weight.detach().clone()
    trainer = Trainer(model, TrainConfig(lr=1e-3, loss=LossConfig(kind="sft")))
    assert trainer.config.logits_chunk > 0
    metrics = trainer.train_step(group(0, vocab=VOCAB))
    assert shapes and all(s[1] == 0 for s in shapes), f"the model's head saw rows: {shapes}"
    assert metrics["grad_norm"] > 0 and metrics["entropy"] > 0
    assert not torch.equal(before, model.model.embed_tokens.weight), "the tied head/embedding did not learn"
