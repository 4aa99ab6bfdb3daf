"""The tree benchmark's workloads have the sharing structure the issue describes."""

from __future__ import annotations

import pytest

from rollyard.bench.tree import QUICK, WORKLOADS, build_samples, main
from rollyard.train import pack_samples


def test_multiturn_calls_are_prefixes_of_the_next_call() -> None:
    spec = WORKLOADS["multiturn"]
    samples = build_samples("multiturn", spec, vocab=2048)
    assert len(samples) == spec["trajectories"] * spec["turns"]
    first, second = samples[0].token_ids, samples[1].token_ids
    assert second[: len(first)] == first
    assert len(second) == len(first) + 2 * spec["turn"]
    assert sum(samples[0].loss_mask) == spec["turn"]


def test_group_workload_merges_to_prompt_plus_completions() -> None:
    spec = WORKLOADS["group"]
    samples = build_samples("group", spec, vocab=4096)
    packed = pack_samples(samples, token_budget=spec["budget"], max_tree_tokens=spec["budget"])
    assert packed.merged_tokens == spec["prompt"] + spec["completions"] * spec["completion"]


@pytest.mark.slow
def test_quick_benchmark_reports_a_speedup_and_equal_losses(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("rollyard.bench._report.RESULTS_DIR", tmp_path)
    doc = main(quick=True)
    summary = doc["summary"]
    assert summary["speedup_group"] > 1.0
    assert summary["loss_diff_max"] < 1e-4
    assert QUICK["group"]["size"] == "tiny"
