"""``rollyard bench drafting-eagle`` (the eagle rows of ``bench drafting``) without engines: each
run's config is the reading demo's with its drafting, a run dir prepared from the cached warm
start is one the demo's SFT step takes as done, and the summary holds the issue's keys."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import rollyard.bench._report
from rollyard.bench import drafting_eagle
from rollyard.bench.drafting_eagle import (
    QUICK_WARM_STEPS,
    RUNS,
    K,
    _prepare,
    run_config,
    summarize,
    summary,
)
from rollyard.engines.drafting.eagle_files import HEAD_DIR
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
    assert partial["eagle_missing"] == "frozen,grouped,decode" and "eagle_missing" not in s


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


@pytest.fixture
def calls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """drafting_eagle.main without vLLM: the warm start and demonstrations are files, the trainer
    writes a run dir (the online run's last version with its head) and returns metrics rows that
    depend on the run and its steps, decode returns tok/s; what it was called for, in order."""
    got: list[str] = []
    model = tmp_path / "model"

    def train_run(
        name: str, root: Path, model_: Path, demo_file: Path, steps: int, quick: bool
    ) -> list[dict[str, Any]]:
        assert not root.exists() and model_ == model  # every run starts from an empty run dir
        for v in range(1, steps + 1):
            (root / "weights" / f"v{v:06d}" / HEAD_DIR).mkdir(parents=True)
        (root / "checkpoint").mkdir()
        got.append(name)
        i = list(RUNS).index(name)
        return [
            {"step": s, "spec_drafts": 10 * s, "spec_acceptance_len": 1.5 + 0.1 * i + 0.01 * s}
            for s in range(1, steps + 1)
        ]

    def decode(final: Path, turns_from: Path, levels: list[int]) -> dict[str, Any]:
        assert final.parent.parent.name == "online" and (final / HEAD_DIR).is_dir()
        got.append(f"decode {final.name}")
        tok_s = {c: {"tok_s": float(c)} for c in map(str, levels)}
        return {
            "none": {"greedy": [[1]], "levels": tok_s},
            "eagle": {"greedy": [[1]], "levels": {c: {"tok_s": 1.5 * float(c)} for c in tok_s}},
        }

    monkeypatch.setattr(drafting_eagle, "sft_model", lambda: model)
    monkeypatch.setattr(drafting_eagle, "demos", lambda m: tmp_path / "demos.jsonl")
    monkeypatch.setattr(drafting_eagle, "train_run", train_run)
    monkeypatch.setattr(drafting_eagle, "decode", decode)
    monkeypatch.setattr(rollyard.bench._report, "RESULTS_DIR", tmp_path / "results")
    return got


def test_the_eagle_rows_in_pieces_reuse_finished_runs_and_sum_up_as_one_call(
    tmp_path: Path, calls: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    whole = drafting_eagle.main(steps=3)  # today's behaviour: a temporary directory
    assert calls == ["online", "frozen", "grouped", "decode v000003"]
    assert whole["summary"]["online_minus_frozen_last"] < 0
    assert whole["summary"]["tok_s_ratio_online_16"] == 1.5
    calls.clear()

    work = tmp_path / "work"
    first = drafting_eagle.main(steps=3, work=work, max_runs=1)
    assert calls == ["online"] and (work / "online.json").is_file()
    assert "accept_online_last" in first["summary"] and "accept_frozen_last" not in first["summary"]
    assert first["summary"]["eagle_missing"] == "frozen,grouped,decode"  # a piece says so
    assert "eagle_missing" not in whole["summary"]
    assert not (work / "online" / "checkpoint").exists()  # decode needs the last version only
    # a row half-written when the session ended: ignored, the run redone
    (work / ".frozen.json.tmp").write_text('{"key": {"bench": "drafting')
    calls.clear()
    second = drafting_eagle.main(steps=3, work=work, max_runs=1)
    assert calls == ["frozen"] and second["details"]["reused_runs"] == ["online"]
    assert not (work / "frozen" / "weights").exists()  # only the online run's weights are served
    calls.clear()
    third = drafting_eagle.main(steps=3, work=work)
    assert calls == ["grouped", "decode v000003"]  # the patched trainer not called for the reused
    assert third["details"]["reused_runs"] == ["online", "frozen"]
    assert third["summary"] == whole["summary"]
    measured = third["details"]["measured"]
    assert [measured[n]["reused"] for n in RUNS] == [True, True, False]
    assert all(m["at"] and m["loadavg"] for m in measured.values())
    stored = json.loads((work / "frozen.json").read_text())
    assert stored["key"]["k"] == K and stored["key"]["drafting"]["online"] is False
    assert stored["key"]["rows"] == drafting_eagle.ROWS and str(tmp_path) not in json.dumps(stored["key"])
    assert stored["row"] == third["details"]["runs"]["frozen"]

    calls.clear()  # all three reused: only decode reruns, on the kept online version
    assert drafting_eagle.main(steps=3, work=work)["summary"] == whole["summary"]
    assert calls == ["decode v000003"]

    # a row made under another key is redone and overwritten; so is the online run without its version
    stored["key"]["k"] = K + 1
    (work / "frozen.json").write_text(json.dumps(stored))
    for v in (work / "online" / "weights").iterdir():
        (v / HEAD_DIR).rmdir()
    calls.clear()
    with caplog.at_level(logging.WARNING):
        fourth = drafting_eagle.main(steps=3, work=work)
    assert calls == ["online", "frozen", "decode v000003"] and fourth["details"]["reused_runs"] == ["grouped"]
    assert "frozen.json has another key" in caplog.text and "no last version" in caplog.text
    assert json.loads((work / "frozen.json").read_text())["key"]["k"] == K
    assert fourth["summary"] == whole["summary"]
    calls.clear()
    assert drafting_eagle.main(steps=2, work=work, max_runs=1)["details"]["reused_runs"] == []
    assert calls == ["online"]  # other steps: no row is the same run
