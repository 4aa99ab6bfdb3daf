"""The grouped drafter's pure parts: suffix index, group identification, row tracking, proposer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from rollyard.engines.drafting import (
    DrafterSettings,
    GroupedSuffixDrafter,
    GroupIndexes,
    GroupTable,
    RowTracker,
    SoloSuffixDrafter,
    SuffixIndex,
)

tokens = st.lists(st.integers(0, 5), min_size=0, max_size=40)


def _occurs(gram: list[int], seq: list[int]) -> bool:
    m = len(gram)
    return any(seq[i : i + m] == gram for i in range(len(seq) - m + 1))


@given(
    siblings=st.lists(st.tuples(tokens, tokens), min_size=1, max_size=5),
    context=st.lists(st.integers(0, 5), min_size=1, max_size=12),
    depth=st.integers(1, 6),
    min_match=st.integers(1, 3),
    k=st.integers(1, 8),
)
def test_every_drafted_token_continues_a_suffix_that_occurred_in_a_sibling(
    siblings: list[tuple[list[int], list[int]]], context: list[int], depth: int, min_match: int, k: int
) -> None:
    index = SuffixIndex(depth=depth)
    for i, (prefix, out) in enumerate(siblings):
        index.start(i, prefix)
        index.extend(i, out)
    draft = index.draft(context, k, min_match=min_match)
    assert len(draft) <= k
    s = context + draft
    # the contexts an index holds are within one sibling's (prefix tail + output)
    seqs = [prefix[-depth:] + out for prefix, out in siblings]
    for j in range(len(context), len(s)):
        gram = s[j - min(min_match, depth) : j + 1]
        assert any(_occurs(gram, seq) for seq in seqs), (gram, seqs)


@given(seqs=st.lists(tokens, min_size=1, max_size=8), depth=st.integers(1, 8), cap=st.integers(0, 60))
def test_memory_is_bounded_by_the_token_cap(seqs: list[list[int]], depth: int, cap: int) -> None:
    index = SuffixIndex(depth=depth, max_tokens=cap)
    for i, seq in enumerate(seqs):
        index.extend(i, seq)
    assert index.tokens <= cap
    assert index.entries() <= depth * cap


def test_the_draft_is_the_most_frequent_continuation_of_the_longest_match() -> None:
    index = SuffixIndex(depth=4)
    index.extend("a", [1, 2, 3, 4, 5])
    index.extend("b", [9, 2, 3, 7, 8])
    index.extend("c", [9, 2, 3, 7, 8])
    assert index.draft([2, 3], k=3) == [7, 8]  # two siblings against one
    assert index.draft([1, 2, 3], k=3) == [4, 5]  # the longer match wins
    assert index.draft([6], k=3) == []  # never seen


def test_min_prob_stops_a_draft_when_siblings_disagree() -> None:
    index = SuffixIndex(depth=2)
    for i, nxt in enumerate([5, 6, 7, 5]):
        index.extend(i, [1, 2, nxt])
    assert index.draft([1, 2], k=4, min_prob=0.0) == [5]
    assert index.draft([1, 2], k=4, min_prob=0.6) == []  # 5 follows only half the time


def test_siblings_and_later_turns_share_a_group_other_prompts_do_not() -> None:
    table = GroupTable()
    prompt = np.arange(20)
    g, new = table.group_of(prompt)
    assert new
    assert table.group_of(prompt.copy()) == (g, False)  # a sibling
    assert table.group_of(np.concatenate([prompt, [7, 7, 7]]))[0] == g  # its next turn
    other, new = table.group_of(np.arange(1, 21))
    assert new and other != g
    rewritten = np.concatenate([prompt[:10], [3, 3]])  # history rewritten: its own group
    assert table.group_of(rewritten)[0] not in (g, other)


def test_the_longest_root_wins_when_two_roots_prefix_a_prompt() -> None:
    table = GroupTable()
    long, _ = table.group_of(np.arange(10))
    short, new = table.group_of(np.arange(5))  # seen second, so it is a root of its own
    assert new and short != long
    assert table.group_of(np.arange(7))[0] == short
    assert table.group_of(np.arange(12))[0] == long


def test_group_tables_are_bounded() -> None:
    table = GroupTable(max_roots=3)
    for i in range(10):
        table.group_of(np.array([i, i]))
    assert len(table) == 3
    now = [0.0]
    indexes = GroupIndexes(lambda: now[0], max_groups=2, expire_s=10.0)
    for g in range(5):
        indexes.get(g)
    assert len(indexes) == 2
    now[0] = 11.0
    indexes.get(99)
    assert indexes.sweep() == 1 and len(indexes) == 1  # one went to the cap, one expired


def test_a_request_is_followed_when_its_row_moves() -> None:
    tracker = RowTracker(span=4)
    row = np.zeros(32, dtype=np.int32)
    row[:10] = np.arange(10)
    req, new = tracker.observe(row, 10, 1)
    assert new and req.prompt_len == 9
    moved = row.copy()  # another batch slot, two more tokens accepted
    moved[10:12] = [40, 41]
    again, new = tracker.observe(moved, 12, 2)
    assert again is req and not new


def _config(k: int = 4) -> SimpleNamespace:
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        model_config=SimpleNamespace(max_model_len=256),
    )


class Batch:
    """A stand-in for vLLM's persistent batch: rows of tokens, one sampled token per step."""

    def __init__(self, prompts: list[list[int]]) -> None:
        self.rows = np.zeros((len(prompts), 256), dtype=np.int32)
        self.n = np.array([len(p) for p in prompts])
        for i, p in enumerate(prompts):
            self.rows[i, : len(p)] = p

    def step(self, drafter: GroupedSuffixDrafter, tokens: list[int]) -> list[list[int]]:
        for i, t in enumerate(tokens):
            self.rows[i, self.n[i]] = t
            self.n[i] += 1
        return drafter.propose([[t] for t in tokens], self.n, self.rows)


def test_a_sibling_drafts_what_its_group_already_wrote_and_a_stranger_does_not() -> None:
    settings = DrafterSettings(min_match=2, min_prob=0.0)
    answer = [50, 51, 52, 53, 54, 55, 56, 57]
    for cls, expect_hit in ((GroupedSuffixDrafter, True), (SoloSuffixDrafter, False)):
        drafter = cls(_config(), settings)
        first = Batch([[1, 2, 3]])
        first.step(drafter, [answer[0]])
        for t in answer[1:]:
            first.step(drafter, [t])
        second = Batch([[1, 2, 3]])  # a sibling, arriving later
        second.step(drafter, [answer[0]])
        drafts = second.step(drafter, [answer[1]])
        assert (drafts[0] == answer[2:6]) is expect_hit, (cls.__name__, drafts)


def test_a_request_keeps_drafting_its_own_loop_when_its_siblings_wrote_otherwise() -> None:
    """Pooled counts must not drown a request's own repetition: the group index says 2 -> 3
    (three siblings), this request's own text says 2 -> 9, and it is its own text it repeats."""
    settings = DrafterSettings(min_match=1, group_min_match=1, min_prob=0.0)
    drafter = GroupedSuffixDrafter(_config(), settings)
    siblings = Batch([[1], [1], [1]])
    for t in [2, 3, 4, 2, 3, 4, 2, 3, 4]:
        siblings.step(drafter, [t, t, t])
    looping = Batch([[1]])
    drafts = [looping.step(drafter, [t])[0] for t in [2, 9, 2, 9, 2, 9, 2]]
    assert drafts[-1][:2] == [9, 2], drafts
    assert drafter.picked["own"] > 0 and drafter.picked["group"] > 0


def test_siblings_agreement_outscores_one_sighting_in_the_requests_own_prompt() -> None:
    """The prompt shows 1 2 -> 3 4 5 6 once; 15 siblings all wrote 1 2 -> 7 8 9 10. With the
    default prior the group's consensus wins; with no prior the single sighting (frequency 1,
    score 4) ties it and the own draft is kept, which is what replaying real samples showed to
    go wrong: the own draft won most contests and was right far less often than the group's.
    The prior ranks drafts without shortening them: the solo drafter drafts the same either way."""
    prompt, answer = [1, 2, 3, 4, 5, 6, 1], [2, 7, 8, 9, 10, 11]
    assert DrafterSettings().prior == 1.0
    for prior, expect, source in ((1.0, [7, 8, 9, 10], "group"), (0.0, [3, 4, 5, 6], "own")):
        settings = DrafterSettings(prior=prior, min_match=2, group_min_match=2, min_prob=0.0)
        drafter = GroupedSuffixDrafter(_config(), settings)
        siblings = Batch([prompt] * 15)
        for t in answer:
            siblings.step(drafter, [t] * 15)
        picked = dict(drafter.picked)
        late = Batch([prompt])
        assert late.step(drafter, [answer[0]])[0] == expect, prior
        assert drafter.picked[source] == picked[source] + 1
        solo = SoloSuffixDrafter(_config(), settings)
        assert Batch([prompt]).step(solo, [answer[0]])[0] == [3, 4, 5, 6]


def test_the_prior_comes_from_the_config_through_the_environment() -> None:
    from rollyard.engines.drafting import DraftingConfig

    env = DraftingConfig(method="grouped_suffix", prior=0.5).environment()
    assert env == {"ROLLYARD_DRAFT_PRIOR": "0.5"}
    assert DrafterSettings.from_env(env).prior == 0.5


def test_own_indexes_are_bounded_and_rebuilt_from_the_row_when_dropped() -> None:
    drafter = SoloSuffixDrafter(_config(), DrafterSettings(max_requests=2, min_match=1, min_prob=0.0))
    batch = Batch([[7, 8], [5, 6], [3, 4]])  # three requests, room for two own indexes
    batch.step(drafter, [7, 5, 3])
    assert len(drafter.own) == 2
    drafts = batch.step(drafter, [8, 6, 4])  # the first one's index was dropped: rebuilt
    assert len(drafter.own) == 2 and drafts[0][:1] == [7]  # its prompt 7 8 7 8: 7 follows 8


def test_a_draft_scores_its_expected_accepted_tokens_and_the_prior_discounts_thin_evidence() -> None:
    index = SuffixIndex(depth=2)
    index.extend("a", [1, 2, 3, 4])
    assert index.scored_draft([1, 2], k=2) == ([3, 4], 2.0)  # each seen once, always followed
    cautious = SuffixIndex(depth=2, prior=1.0)
    cautious.extend("a", [1, 2, 3, 4])
    tokens, score = cautious.scored_draft([1, 2], k=2)
    assert tokens == [3, 4] and score == 0.5 + 0.25
    assert cautious.scored_draft([1, 2], k=2, min_prob=0.9)[0] == [3, 4]  # ranked lower, not cut
    for seq in "bcd":  # three more sightings of 2 -> 3: the estimate firms up
        cautious.extend(seq, [1, 2, 3])
    assert cautious.continuation([1, 2])[:3] == (3, 4, 4)
    assert cautious.scored_draft([1, 2], k=1) == ([3], 4 / 5)


def test_draft_length_shrinks_as_the_batch_fills() -> None:
    s = DrafterSettings(budget=16)
    assert [s.draft_len(8, b) for b in (1, 2, 4, 8, 16, 17)] == [8, 8, 4, 2, 1, 0]


def test_settings_come_from_the_environment() -> None:
    s = DrafterSettings.from_env({"ROLLYARD_DRAFT_BUDGET": "8", "ROLLYARD_DRAFT_MIN_PROB": "0.5"})
    assert s.budget == 8 and s.min_prob == 0.5


SPEC_METRICS = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="tiny"} 10.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="tiny"} 1.7e+09
# TYPE vllm:spec_decode_num_draft_tokens counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="tiny"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens counter
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="tiny"} 15.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="0"} 8.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="1"} 5.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="tiny",position="2"} 2.0
"""


def test_acceptance_length_and_per_position_rates_come_from_vllm_counters() -> None:
    from rollyard.engines.metrics import acceptance, parse_vllm_metrics

    stats = parse_vllm_metrics(SPEC_METRICS)
    assert (stats.spec_drafts, stats.spec_draft_tokens, stats.spec_accepted_tokens) == (10, 40, 15)
    assert stats.spec_accepted_per_pos == [8, 5, 2]
    since_start = acceptance(None, [stats])
    assert since_start["spec_acceptance_len"] == 2.5
    assert since_start["spec_accepted_per_pos"] == [0.8, 0.5, 0.2]
    later = stats.model_copy(update={"spec_drafts": 20, "spec_accepted_tokens": 20})
    assert acceptance([stats], [later])["spec_acceptance_len"] == 1.5  # 5 more accepted in 10 drafts
    assert acceptance([later], [stats])["spec_drafts"] == 10  # counters went down: a restart
    assert acceptance([stats], [stats]) == {}  # nothing drafted in between


def test_the_drafting_config_becomes_vllm_flags_and_environment() -> None:
    import json

    from rollyard.engines.drafting import DraftingConfig

    assert DraftingConfig().engine_args() == []
    cfg = DraftingConfig.parse("grouped_suffix:8").model_copy(update={"budget": 32})
    flag, spec = cfg.engine_args()
    assert flag == "--speculative-config"
    assert json.loads(spec) == {
        "method": "custom_class",
        "model": "rollyard.engines.drafting.GroupedSuffixDrafter",
        "num_speculative_tokens": 8,
    }
    assert cfg.environment() == {"ROLLYARD_DRAFT_BUDGET": "32"}
    assert json.loads(DraftingConfig.parse("ngram").engine_args()[1])["method"] == "ngram"


def test_replayed_siblings_that_share_an_answer_draft_it_from_the_group_only() -> None:
    from rollyard.bench._replay import replay

    answer = list(range(50, 70))
    outputs = [[*range(80, 80 + 2 * i), *answer] for i in range(4)]  # later ones start it later
    cfg = _config()
    grouped = replay(GroupedSuffixDrafter(cfg, DrafterSettings()), [1, 2, 3], outputs)
    solo = replay(SoloSuffixDrafter(cfg, DrafterSettings()), [1, 2, 3], outputs)
    assert solo.accepted == 0 and solo.tokens == grouped.tokens == 4 * 20 + 2 * 6
    assert grouped.accepted > 0 and grouped.acceptance_len > 1.0 and 0 < grouped.share < 1


def test_siblings_decoding_in_lockstep_have_nothing_ahead_to_draft_from() -> None:
    """Replayed G at once, every sibling is at the same position, so the group's index holds
    nothing beyond it; staggered (fewer slots than siblings), later siblings draft what earlier
    ones wrote. Why the benchmark measures both and why a probe-first schedule matters."""
    from rollyard.bench._replay import replay

    text = [(7 * i) % 50 for i in range(40)]  # no repeats of its own: nothing to draft alone
    outputs = [list(text) for _ in range(8)]
    cfg = _config()
    lockstep = replay(GroupedSuffixDrafter(cfg, DrafterSettings()), [1, 2, 3], outputs)
    staggered = replay(GroupedSuffixDrafter(cfg, DrafterSettings()), [1, 2, 3], outputs, concurrency=2)
    solo = replay(SoloSuffixDrafter(cfg, DrafterSettings()), [1, 2, 3], outputs, concurrency=2)
    assert lockstep.tokens == staggered.tokens == 8 * 40
    assert lockstep.accepted == 0 and solo.accepted == 0
    assert staggered.share > 0.5 and staggered.acceptance_len > 4.0
