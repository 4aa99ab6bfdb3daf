"""The flex BlockMask built from DFS ranges equals ``create_block_mask``'s, block tables and mask.

Flex attention through a model is not run here: transformers compiles it, and on this CPU the
inductor C++ template fails to build for some shapes (``cur_qSplitSize8`` undeclared) after ~2 min
of compiling; the model-level merged = unmerged check for flex runs in ``tests/gpu``."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core import Sample
from rollyard.train import pack_samples
from rollyard.train.attention import tree_mask
from rollyard.train.flex_mask import tree_block_mask

flex = pytest.importorskip("torch.nn.attention.flex_attention")


@st.composite
def forests(draw: st.DrawFn) -> list[Sample]:
    """Prompts, branches off random prefixes, long and one-token tails (blocks of every kind)."""
    rng = random.Random(draw(st.integers(0, 2**31)))
    alphabet = draw(st.sampled_from([3, 50]))
    seqs: list[list[int]] = []
    for _ in range(draw(st.integers(1, 10))):
        base = rng.choice(seqs) if seqs and rng.random() < 0.7 else []
        tail = [rng.randrange(alphabet) for _ in range(rng.choice([1, 3, 17, 60, 150]))]
        seqs.append(base[: rng.randint(0, len(base))] + tail)
    return [
        Sample(
            token_ids=s,
            loss_mask=[0] + [1] * (len(s) - 1),
            logprobs=[-1.0] * len(s),
            advantages=[0.5] * len(s),
        )
        for s in seqs
    ]


def _one_row(samples: list[Sample]):  # type: ignore[no-untyped-def]
    return pack_samples(samples, token_budget=10**6, max_tree_tokens=10**6).micro_batches[0]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(forests(), st.sampled_from([4, 8, 16, 128]))
def test_range_built_block_mask_equals_create_block_mask(samples: list[Sample], block: int) -> None:
    mb = _one_row(samples)
    end = torch.from_numpy(mb.subtree_end)
    n = mb.num_tokens
    ref = flex.create_block_mask(
        lambda b, h, q, kv: (kv <= q) & (q < end[kv]), None, None, n, n, device="cpu", BLOCK_SIZE=block
    )
    mine = tree_block_mask(mb, "cpu", block)
    assert mine.shape == ref.shape and mine.BLOCK_SIZE == ref.BLOCK_SIZE
    pairs = [("kv_num_blocks", "kv_indices"), ("full_kv_num_blocks", "full_kv_indices")]
    pairs += [("q_num_blocks", "q_indices"), ("full_q_num_blocks", "full_q_indices")]  # for backward
    for num, idx in pairs:
        counts = getattr(ref, num)
        assert torch.equal(getattr(mine, num), counts), num
        for row, c in enumerate(counts[0, 0].tolist()):  # past the count a row's indices are padding
            assert torch.equal(getattr(mine, idx)[0, 0, row, :c], getattr(ref, idx)[0, 0, row, :c]), idx
    assert torch.equal(mine.to_dense(), ref.to_dense())
    # and the mask_mod of the partial blocks is the ancestor relation itself
    q, kv = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    allowed = mine.mask_mod(0, 0, q, kv)
    assert torch.equal(allowed, torch.from_numpy(mb.ancestor_mask()))


def test_flex_impl_gets_the_range_built_mask() -> None:
    rng = random.Random(0)
    prompt = [rng.randrange(9) for _ in range(200)]
    samples = [
        Sample(token_ids=prompt + [rng.randrange(9) for _ in range(90)], loss_mask=[0] + [1] * 289,
               logprobs=[0.0] * 290, advantages=[1.0] * 290)
        for _ in range(4)
    ]  # fmt: skip
    mb = _one_row(samples)
    mask = tree_mask(mb, "flex_attention", torch.device("cpu"), torch.float32)
    assert isinstance(mask, flex.BlockMask)
    full_blocks = int(mask.full_kv_num_blocks.sum())
    assert full_blocks > 0, "the shared prompt's blocks are full: no mask_mod evaluated there"
    assert torch.equal(mask.to_dense(), tree_block_mask(mb, "cpu").to_dense())
