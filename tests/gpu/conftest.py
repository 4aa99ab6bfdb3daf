"""The GPU smoke suite: every test here is marked ``gpu`` and skipped where CUDA is absent.

It needs only torch, transformers and rollyard's light dependencies (no vLLM, no download: models are
randomly initialised from shipped architecture configs). ``pytest -m gpu tests/gpu`` on one H100:
budget 10 minutes, most of it flex_attention's first compilations.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.gpu)
            if not torch.cuda.is_available():
                item.add_marker(skip)
