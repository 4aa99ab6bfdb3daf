"""SFT: demonstrations become samples and train through the same Trainer; ``rollyard sft`` end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rollyard.cli import _register, app
from rollyard.core import DataError
from rollyard.train import build_model
from rollyard.train.sft import demonstration_sample, load_demonstrations, run_sft


def test_demonstration_trains_only_the_completion() -> None:
    s = demonstration_sample({"prompt_ids": [5, 6, 7], "completion_ids": [8, 9]})
    assert s.token_ids == [5, 6, 7, 8, 9]
    assert s.loss_mask == [0, 0, 0, 1, 1]


def test_sample_records_are_accepted_as_they_are() -> None:
    rec = {"token_ids": [1, 2], "loss_mask": [0, 1], "logprobs": [0.0, -1.0], "advantages": [0.0, 2.0]}
    assert demonstration_sample(rec).advantages == [0.0, 2.0]


def test_bad_demonstration_lines_name_the_line(tmp_path: Path) -> None:
    f = tmp_path / "d.jsonl"
    f.write_text('{"prompt_ids": [1], "completion_ids": [2]}\n{"prompt_ids": [1]}\n')
    with pytest.raises(DataError, match=":2:"):
        load_demonstrations(f)
    f.write_text('{"prompt_ids": [], "completion_ids": [2]}\n')
    with pytest.raises(DataError, match="non-empty"):
        load_demonstrations(f)


def _fixture_dirs(tmp_path: Path) -> tuple[Path, Path]:
    model_dir = tmp_path / "base"
    build_model("test", seed=0).save_pretrained(model_dir)
    data = tmp_path / "demo.jsonl"
    lines = [{"prompt_ids": [3, 4, 5 + k], "completion_ids": [10, 11, 12, 13 + k]} for k in range(4)]
    data.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return model_dir, data


def test_sft_lowers_the_demonstration_loss_and_writes_a_version(tmp_path: Path) -> None:
    model_dir, data = _fixture_dirs(tmp_path)
    result = run_sft(model_dir, data, tmp_path / "out", steps=8, batch_size=4, lr=3e-3)
    assert result["losses"][-1] < result["losses"][0]
    assert Path(result["weights"]) == tmp_path / "out" / "v000008"
    assert (Path(result["weights"]) / "config.json").is_file()


def test_rollyard_sft_command_prints_the_weight_dir(tmp_path: Path) -> None:
    model_dir, data = _fixture_dirs(tmp_path)
    _register()
    res = CliRunner().invoke(
        app,
        ["sft", str(model_dir), str(data), "--out", str(tmp_path / "w"), "--steps", "2", "--batch-size", "2"],
    )
    assert res.exit_code == 0, res.output
    assert res.output.strip().splitlines()[-1] == str(tmp_path / "w" / "v000002")
