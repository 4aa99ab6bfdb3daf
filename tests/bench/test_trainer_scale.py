"""``rollyard bench trainer-scale --quick``: each feature measured beside its baseline (FSDP2 figures,
measured by the FSDP side's ``bench/_fsdp.py``, are left out here by a monkeypatch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollyard.bench import trainer_scale


@pytest.mark.slow
def test_quick_bench_measures_chunked_logits_mask_and_plan(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr("rollyard.bench._report.RESULTS_DIR", tmp_path)
    monkeypatch.setattr(trainer_scale, "fsdp_figures", lambda _tmp: {})
    trainer_scale.main(quick=True)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("trainer-scale: logits_peak_gb=")
    doc = json.loads((tmp_path / "trainer-scale.json").read_text())
    s, d = doc["summary"], doc["details"]
    logits = d["logits"]
    # same loss and head gradient, less memory: chunks of 512 rows against 1,024 rows of logits
    assert logits["chunked"]["loss"] == pytest.approx(logits["full"]["loss"], rel=1e-6)
    assert logits["chunked"]["head_grad_norm"] == pytest.approx(logits["full"]["head_grad_norm"], rel=1e-5)
    assert 0 < s["logits_peak_ratio"] < 0.6
    mask = d["mask"]
    assert mask["ranges"]["tokens"] == 8192 and mask["ranges"]["full_blocks"] > 0
    # the same mask as create_block_mask's at the baseline size, built faster
    base, ours = mask["create_block_mask"], mask["ranges_at_baseline_size"]
    assert (ours["full_blocks"], ours["partial_blocks"]) == (base["full_blocks"], base["partial_blocks"])
    assert ours["seconds"] < base["seconds"]
    assert s["mask_build_s_32k"] < 1.0 and s["mask_mb_32k"] < 200
    assert s["plan_7b_headroom_gb"] >= 20
