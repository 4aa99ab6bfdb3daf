"""Small seeded batches and models shared by the trainer tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from train_batches import make_group

from rollyard.core import Sample


@pytest.fixture
def group() -> Callable[..., list[Sample]]:
    return make_group


@pytest.fixture(autouse=True)
def _two_threads() -> None:
    torch.set_num_threads(2)
