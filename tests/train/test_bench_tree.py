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
def test_quick_benchmark_interleaves_rounds_and_reports_bounds(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr("rollyard.bench._report.RESULTS_DIR", tmp_path)
    monkeypatch.setenv("ROLLYARD_BENCH_TREE_ROUNDS", "2")
    doc = main(quick=True)
    summary, details = doc["summary"], doc["details"]
    assert [r["order"] for r in details["multiturn"]["rounds"]] == [
        ["merged", "unmerged"],
        ["unmerged", "merged"],
    ]
    assert summary["speedup_group"] > 1.0
    assert summary["loss_diff_max"] < 1e-4
    for name in ("group", "multiturn"):
        assert summary[f"token_bound_{name}"] >= summary[f"flop_ratio_{name}"] > 1.0
        assert summary[f"eff_{name}"] == pytest.approx(
            summary[f"speedup_{name}"] / summary[f"token_bound_{name}"]
        )
        phases = details[name]["rounds"][0]["merged"]["phases"]
        assert set(phases) == {"mask", "forward", "loss", "backward", "other"}
    assert QUICK["group"]["size"] == "tiny"
