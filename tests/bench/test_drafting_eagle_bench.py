"""``rollyard bench drafting-eagle`` (the eagle rows of ``bench drafting``) without engines: each
run's config is the reading demo's with its drafting, a run dir prepared from the cached warm
start is one the demo's SFT step takes as done, and the summary holds the issue's keys."""

from __future__ import annotations

from pathlib import Path

from rollyard.bench.drafting_eagle import (
    QUICK_WARM_STEPS,
    RUNS,
    _prepare,
    run_config,
    summarize,
    summary,
)
from rollyard.rollout.sft import finished_warm_start


def test_each_run_is_the_demo_with_its_drafting(tmp_path: Path) -> None:
    for name in RUNS:
        cfg = run_config(name, tmp_path / "model", steps=3, quick=False)
        d = cfg.engine.drafting
        assert d.method == ("grouped_suffix" if name == "grouped" else "eagle")
        if d.method == "eagle":
            assert d.head == "auto" and d.online == (name == "online")
            assert d.warm_steps == type(d)().warm_steps  # head: auto with its default warm-up
        assert cfg.sft.enabled  # the run's SFT step finds the warm start done, and its demos
        assert cfg.run.steps == 3 and cfg.tasks.eval is None and cfg.publish.mode == "disk"
        assert cfg.run.mode == "sync"  # each step drafted by the head of the version before it
        assert cfg.run.groups_per_step == 4  # the demo's
    quick = run_config("online", tmp_path, steps=2, quick=True)
    assert quick.run.groups_per_step == 2 and quick.engine.drafting.warm_steps == QUICK_WARM_STEPS
    assert run_config("grouped", tmp_path, steps=2, quick=True).engine.drafting.method == "grouped_suffix"


def test_a_prepared_run_dir_skips_the_sft(tmp_path: Path) -> None:
    model = tmp_path / "cache" / "model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    demos = tmp_path / "cache" / "demos.jsonl"
    demos.write_text("{}\n")
    _prepare(tmp_path / "run", model, demos)
    done = finished_warm_start(tmp_path / "run" / "sft")
    assert done is not None and done.resolve() == model.resolve()
    assert (tmp_path / "run" / "sft" / "demos.jsonl").read_text() == "{}\n"


def test_the_summary_has_the_issues_keys() -> None:
    runs = {
        n: {"accept_first": 1.0 + i, "accept_last": 2.0 + i, "last_drafted_step": 3}
        for i, n in enumerate(RUNS)
    }
    greedy = [[1, 2, 3]]
    details = {
        "steps": 3,
        "runs": runs,
        "decode": {
            "none": {"greedy": greedy, "levels": {"4": {"tok_s": 10.0}, "16": {"tok_s": 40.0}}},
            "eagle": {"greedy": greedy, "levels": {"4": {"tok_s": 15.0}, "16": {"tok_s": 30.0}}},
        },
    }
    s = summary(details)
    assert {"accept_online_last", "accept_frozen_last", "accept_grouped_last"} <= set(s)
    assert s["tok_s_ratio_online_4"] == 15.0 / 10.0 and s["tok_s_ratio_online_16"] == 30.0 / 40.0
    assert s["online_minus_frozen_last"] == runs["online"]["accept_last"] - runs["frozen"]["accept_last"]
    assert s["online_minus_frozen_step"] == 3
    assert s["eagle_t0_identical"] is True
    details["decode"]["eagle"]["greedy"] = [[1, 2, 4]]
    assert summary(details)["eagle_t0_identical"] is False
    partial = summary({"steps": 3, "runs": {"online": runs["online"]}})  # a bench cut short
    assert "accept_online_last" in partial and "accept_frozen_last" not in partial


def test_bench_all_runs_the_eagle_rows_once_inside_drafting() -> None:
    from rollyard.cli.bench import _part_of, available

    assert "drafting-eagle" in available() and _part_of("drafting-eagle") == "drafting"
    assert [n for n in available() if _part_of(n)] == ["drafting-eagle"]


def test_a_step_that_drafted_nothing_has_no_acceptance_length() -> None:
    rows = [
        {"step": 1, "spec_drafts": 10, "spec_acceptance_len": 1.9},
        {"step": 2, "spec_drafts": 12, "spec_acceptance_len": 2.3},
        {"step": 3},  # its groups were all sampled before step 2 ended
    ]
    s = summarize(rows)
    assert s["accept_first"] == rows[0]["spec_acceptance_len"] and s["first_drafted_step"] == 1
    assert s["accept_last"] == rows[1]["spec_acceptance_len"] and s["last_drafted_step"] == 2
    assert s["accept_per_step"][2] is None
    assert summarize([{"step": 1}])["accept_last"] is None
    cut = summary(
        {
            "steps": 1,
            "runs": {
                "online": {"accept_first": 2.0, "accept_last": 2.0},
                "frozen": {"accept_first": None, "accept_last": None},
            },
        }
    )
    assert "online_minus_frozen_last" not in cut
    # both last drafted at step 1 (the quick run): the same warm head drafted both, no comparison
    first_only = {"accept_first": 1.96, "accept_last": 1.96, "last_drafted_step": 1}
    assert "online_minus_frozen_last" not in summary(
        {"steps": 2, "runs": {"online": first_only, "frozen": {**first_only, "accept_last": 1.95}}}
    )
    # different last drafted steps are not one comparison either
    later = {**first_only, "last_drafted_step": 3}
    assert "online_minus_frozen_last" not in summary(
        {"steps": 3, "runs": {"online": later, "frozen": {**later, "last_drafted_step": 2}}}
    )
