"""Merged (prefix-tree) training equals unmerged training: logprobs, loss and parameter gradients."""

from __future__ import annotations

import functools
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core import Sample
from rollyard.train import build_model, pack_samples, set_attention
from rollyard.train.objective import LossConfig
from rollyard.train.step import forward_backward

VOCAB = 512


@functools.cache
def _model(impl: str) -> torch.nn.Module:
    torch.set_num_threads(2)
    model = build_model("test", seed=1)
    set_attention(model, impl)
    return model


@st.composite
def sample_batches(draw: st.DrawFn) -> list[Sample]:
    """Random trees: a shared prompt (possibly empty), branches off random prefixes of earlier
    samples (possibly one token long), exact duplicates, and a narrow alphabet so branches
    collide and merge by chance."""
    rng = random.Random(draw(st.integers(0, 2**31)))
    alphabet = draw(st.sampled_from([3, 8, VOCAB]))
    prompt = [rng.randrange(alphabet) for _ in range(draw(st.integers(0, 12)))]
    seqs: list[list[int]] = []
    for _ in range(draw(st.integers(1, 7))):
        kind = rng.random()
        if seqs and kind < 0.15:
            seqs.append(list(rng.choice(seqs)))  # identical sample
            continue
        base = rng.choice(seqs) if seqs and kind < 0.6 else prompt
        cut = rng.randint(0, len(base))
        tail = [rng.randrange(alphabet) for _ in range(rng.choice([1, 1, 2, 5, 11]))]
        seqs.append(base[:cut] + tail if base[:cut] + tail else tail)
    samples = []
    for s in seqs:
        n = len(s)
        mask = [0] + [rng.randint(0, 1) for _ in range(n - 1)]
        samples.append(
            Sample(
                token_ids=s,
                loss_mask=mask,
                logprobs=[-rng.random() * 3 for _ in range(n)],
                advantages=[rng.gauss(0, 1) for _ in range(n)],
            )
        )
    return samples


def _run(samples: list[Sample], impl: str, loss: LossConfig, **pack: int | bool) -> tuple[dict, float, dict]:
    model = _model(impl)
    model.zero_grad(set_to_none=True)
    packed = pack_samples(samples, **pack)  # type: ignore[arg-type]
    res = forward_backward(model, samples, packed, loss, impl, keep_logprobs=True)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return res.logprobs, res.loss, grads


def _assert_same(merged: tuple, unmerged: tuple) -> None:
    lp_m, loss_m, g_m = merged
    lp_u, loss_u, g_u = unmerged
    assert lp_m.keys() == lp_u.keys()
    for i in lp_u:
        assert torch.allclose(lp_m[i], lp_u[i], atol=1e-5, rtol=0), f"sample {i} logprobs differ"
    assert loss_m == pytest.approx(loss_u, rel=1e-5, abs=1e-6)
    assert g_m.keys() == g_u.keys()
    for name, g in g_u.items():
        scale = float(g.abs().max())
        assert float((g_m[name] - g).abs().max()) <= 1e-4 * scale + 1e-8, f"grad of {name} differs"


_LOSSES = [LossConfig(kind="ppo"), LossConfig(kind="gspo"), LossConfig(kind="sft")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample_batches(), st.sampled_from(_LOSSES))
def test_merged_tree_training_equals_unmerged(samples: list[Sample], loss: LossConfig) -> None:
    if sum(s.num_loss_tokens for s in samples) == 0:
        samples[0] = samples[0].model_copy(
            update={
                "token_ids": [1, 2],
                "loss_mask": [0, 1],
                "logprobs": [0.0, -1.0],
                "advantages": [0.0, 1.0],
            }
        )
    unmerged = _run(samples, "rollyard_tree", loss, merge=False, token_budget=1)
    merged = _run(samples, "rollyard_tree", loss)
    _assert_same(merged, unmerged)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample_batches(), st.integers(2, 12), st.integers(1, 24), st.sampled_from(_LOSSES))
def test_cut_trees_and_small_micro_batches_change_nothing(
    samples: list[Sample], cap: int, budget: int, loss: LossConfig
) -> None:
    whole = _run(samples, "rollyard_tree", loss)
    cut = _run(samples, "rollyard_tree", loss, max_tree_tokens=cap, token_budget=budget)
    _assert_same(cut, whole)


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(samples=sample_batches())
def test_dense_mask_attention_matches_block_sparse(impl: str, samples: list[Sample]) -> None:
    loss = LossConfig(kind="ppo")
    _assert_same(_run(samples, impl, loss), _run(samples, "rollyard_tree", loss))


def test_long_shared_prompt_group_is_exact() -> None:
    rng = random.Random(3)
    prompt = [rng.randrange(VOCAB) for _ in range(300)]
    samples = []
    for _ in range(4):
        comp = [rng.randrange(VOCAB) for _ in range(40)]
        ids = prompt + comp
        samples.append(
            Sample(
                token_ids=ids,
                loss_mask=[0] * 300 + [1] * 40,
                logprobs=[-1.0] * len(ids),
                advantages=[rng.gauss(0, 1)] * len(ids),
            )
        )
    loss = LossConfig(kind="ppo")
    _assert_same(
        _run(samples, "rollyard_tree", loss),
        _run(samples, "rollyard_tree", loss, merge=False, token_budget=1),
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sample_batches(), st.integers(2, 12), st.integers(1, 24), st.sampled_from(_LOSSES))
def test_cut_merged_training_equals_unmerged(
    samples: list[Sample], cap: int, budget: int, loss: LossConfig
) -> None:
    if sum(s.num_loss_tokens for s in samples) == 0:
        one = {"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0.0, -1.0], "advantages": [0.0, 1.0]}
        samples[0] = samples[0].model_copy(update=one)
    cut = _run(samples, "rollyard_tree", loss, max_tree_tokens=cap, token_budget=budget)
    _assert_same(cut, _run(samples, "rollyard_tree", loss, merge=False, token_budget=1))
