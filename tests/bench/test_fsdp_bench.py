"""The FSDP2 measure ``rollyard bench trainer-scale`` reports: 2 gloo ranks on uneven batches."""

from __future__ import annotations

from pathlib import Path

from rollyard.bench._fsdp import measure_fsdp


def test_two_fsdp_ranks_on_uneven_batches_match_one_process_with_half_the_state(tmp_path: Path) -> None:
    got = measure_fsdp(tmp_path)
    assert got["moved"] > 1e-4  # the single process learned something (weights changed)
    assert got["idle_passes"] > 0  # the batches were uneven: some rank padded its passes
    assert got["fsdp_weight_diff"] <= 1e-5
    assert got["reshard_diff"] == 0.0  # the 2-rank checkpoint loads into one process exactly
    assert 0.45 <= got["rank_state_ratio"] <= 0.55
