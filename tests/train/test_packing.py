"""Tree packing: the trie merges shared prefixes and every sample's tokens map back exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollyard.core import DataError, Sample
from rollyard.train.packing import pack_samples


def _sample(tokens: list[int], prompt: int = 1) -> Sample:
    n = len(tokens)
    return Sample(
        token_ids=tokens,
        loss_mask=[0] * min(prompt, n) + [1] * max(n - prompt, 0),
        logprobs=[0.0] * n,
        advantages=[1.0] * n,
    )


def test_group_members_share_their_prompt_nodes() -> None:
    prompt = [5, 6, 7, 8]
    packed = pack_samples([_sample([*prompt, 1, 2]), _sample([*prompt, 3]), _sample([*prompt, 1, 4])])
    assert packed.merged_tokens == len(prompt) + 4  # 1 is shared by two completions
    assert packed.unmerged_tokens == 6 + 5 + 6
    assert len(packed.micro_batches) == 1


def test_call_by_call_turns_merge_into_one_chain() -> None:
    history = list(range(10, 40))
    samples = [_sample(history[:k]) for k in (10, 20, 30)]
    packed = pack_samples(samples)
    assert packed.merged_tokens == 30
    mb = packed.micro_batches[0]
    assert mb.is_chain


def test_positions_are_depths_and_parents_precede_children() -> None:
    packed = pack_samples([_sample([1, 2, 3]), _sample([1, 4]), _sample([9, 9, 9])])
    mb = packed.micro_batches[0]
    for i, p in enumerate(mb.parent):
        if p < 0:
            assert mb.position_ids[i] == 0
        else:
            assert p < i
            assert mb.position_ids[i] == mb.position_ids[p] + 1


def test_ancestor_mask_is_exactly_ancestors_and_self() -> None:
    packed = pack_samples([_sample([1, 2, 3]), _sample([1, 4, 5]), _sample([7, 8])])
    mb = packed.micro_batches[0]
    mask = mb.ancestor_mask()
    for i in range(mb.num_tokens):
        anc = {i}
        p = mb.parent[i]
        while p >= 0:
            anc.add(int(p))
            p = mb.parent[p]
        assert set(np.flatnonzero(mask[i]).tolist()) == anc


def test_unmerged_packing_gives_one_chain_per_sample() -> None:
    samples = [_sample([1, 2, 3]), _sample([1, 2, 3]), _sample([1, 2])]
    packed = pack_samples(samples, merge=False, token_budget=1)
    assert len(packed.micro_batches) == 3
    assert all(mb.is_chain for mb in packed.micro_batches)
    assert packed.forwarded_tokens == packed.unmerged_tokens


def test_token_budget_splits_trees_into_micro_batches() -> None:
    samples = [_sample([k, 1, 2, 3]) for k in range(6)]  # six separate trees of 4 tokens
    packed = pack_samples(samples, token_budget=8)
    assert [mb.num_tokens for mb in packed.micro_batches] == [8, 8, 8]


def test_long_tree_cut_recomputes_ancestors_and_keeps_every_sample_whole() -> None:
    prompt = list(range(100, 120))
    samples = [_sample([*prompt, *range(k * 10, k * 10 + 8)]) for k in range(6)]
    packed = pack_samples(samples, max_tree_tokens=32, token_budget=32)
    assert len(packed.micro_batches) > 1
    assert packed.forwarded_tokens > packed.merged_tokens  # the prompt is recomputed per part
    seen = sorted(i for mb in packed.micro_batches for i in mb.samples)
    assert seen == list(range(len(samples)))


def test_sample_longer_than_context_is_rejected() -> None:
    with pytest.raises(DataError, match="context"):
        pack_samples([_sample(list(range(10)))], max_context=8)


def test_empty_batch_is_rejected() -> None:
    with pytest.raises(DataError):
        pack_samples([])


_token_lists = st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=12), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(_token_lists, st.integers(2, 16), st.integers(1, 20), st.booleans())
def test_every_token_maps_back_to_its_own_id_and_context(
    token_lists: list[list[int]], max_tree: int, budget: int, merge: bool
) -> None:
    samples = [_sample(t) for t in token_lists]
    packed = pack_samples(samples, max_tree_tokens=max_tree, token_budget=budget, merge=merge)
    covered: list[int] = []
    for mb in packed.micro_batches:
        for i, idx in zip(mb.samples, mb.token_index, strict=True):
            covered.append(i)
            assert mb.input_ids[idx].tolist() == token_lists[i]
            assert mb.position_ids[idx].tolist() == list(range(len(token_lists[i])))
            # each token's node is the child of the previous token's node
            assert mb.parent[idx[0]] == -1
            assert mb.parent[idx[1:]].tolist() == idx[:-1].tolist()
    assert sorted(covered) == list(range(len(samples)))
    assert packed.merged_tokens <= packed.unmerged_tokens


def _chain_with_branches() -> list[Sample]:
    """The issue's hand case: a 1500-token call chain and three one-token branches off it."""
    chain = list(range(1000, 2500))
    return [_sample(chain)] + [_sample([*chain[:cut], 3 + k]) for k, cut in enumerate((300, 800, 1100))]


@pytest.mark.parametrize(
    ("cap", "forwarded"),
    # Before the cut rule forwarded unions of sample paths: 5967, 4415 and 5343 at caps 16, 64, 512.
    [(16, 3703), (64, 3703), (512, 3703), (1200, 2603), (2000, 1503)],
)
def test_cut_chain_with_branches_never_forwards_more_than_unmerged(cap: int, forwarded: int) -> None:
    samples = _chain_with_branches()
    packed = pack_samples(samples, max_tree_tokens=cap)
    assert packed.unmerged_tokens == 3703
    assert packed.forwarded_tokens == forwarded
    assert pack_samples(samples, max_tree_tokens=cap, merge=False).forwarded_tokens == 3703


def test_earlier_calls_of_a_trajectory_ride_along_with_a_call_longer_than_the_cap() -> None:
    history = list(range(10, 110))
    samples = [_sample(history[:k]) for k in (20, 40, 60, 80, 100)]
    packed = pack_samples(samples, max_tree_tokens=32, token_budget=32)
    assert [mb.num_tokens for mb in packed.micro_batches] == [100]  # the longest call alone, as unmerged
    assert sorted(packed.micro_batches[0].samples) == list(range(5))


@st.composite
def _forests(draw: st.DrawFn) -> list[list[int]]:
    """Random prefix forests: long chains, call-by-call prefixes, branches off any prefix of an
    earlier sample, duplicates, and a narrow alphabet so tails collide and merge by chance."""
    alphabet = draw(st.sampled_from([2, 5, 1000]))
    seqs: list[list[int]] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["new", "branch", "prefix", "dup"]))
        longest = draw(st.sampled_from([3, 40, 200]))
        tail = draw(st.lists(st.integers(0, alphabet - 1), min_size=1, max_size=longest))
        if not seqs or kind == "new":
            seqs.append(tail)
            continue
        base = draw(st.sampled_from(seqs))
        if kind == "dup":
            seqs.append(list(base))
        elif kind == "prefix":
            seqs.append(base[: draw(st.integers(1, len(base)))])
        else:
            seqs.append(base[: draw(st.integers(0, len(base)))] + tail)
    return seqs


def _roots(mb) -> list[int]:  # type: ignore[no-untyped-def]
    return [int(r) for r in np.flatnonzero(mb.parent < 0)]


@settings(max_examples=300, deadline=None)
@given(_forests(), st.integers(2, 400), st.integers(1, 600))
def test_merged_never_forwards_more_than_unmerged_and_rows_keep_their_caps(
    token_lists: list[list[int]], cap: int, budget: int
) -> None:
    samples = [_sample(t) for t in token_lists]
    merged = pack_samples(samples, max_tree_tokens=cap, token_budget=budget)
    unmerged = pack_samples(samples, max_tree_tokens=cap, token_budget=budget, merge=False)
    assert unmerged.forwarded_tokens == unmerged.unmerged_tokens
    assert merged.forwarded_tokens <= unmerged.forwarded_tokens
    assert merged.merged_tokens <= merged.forwarded_tokens
    for packed in (merged, unmerged):
        for mb in packed.micro_batches:
            longest = max(len(token_lists[i]) for i in mb.samples)
            if mb.num_tokens > budget:  # only a sample longer than the budget, alone with its prefixes
                assert longest > budget and mb.num_tokens == longest
            for r in _roots(mb):
                size = int(mb.subtree_end[r]) - r
                if size > cap:  # a tree over the cap is one sample's own path, longer than the cap
                    assert size in {len(token_lists[i]) for i in mb.samples} and size > cap
                    assert mb.parent[r + 1 : r + size].tolist() == list(range(r, r + size - 1))
