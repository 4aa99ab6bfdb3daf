"""Shared fixtures: one tiny model and one real vLLM engine per test session.

Engine tests are marked ``engine``; they share the session's server so the suite pays the
~40 s start-up once. A test that changes the engine's weights must restore them.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Two shared cores: generation speed varies with load, which says nothing about correctness.
settings.register_profile(
    "rollyard", deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
settings.load_profile("rollyard")

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "test-models"
ENGINE_KV_TOKENS = 16384
ENGINE_MAX_MODEL_LEN = 2048


def _model_key(size: str, seed: int) -> str:
    """Cache key: the model-making code itself, so a change to it makes a fresh model."""
    import rollyard.engines.chat_template as ct
    import rollyard.engines.tiny_model as tm

    h = hashlib.sha256()
    for mod in (tm, ct):
        h.update(Path(mod.__file__).read_bytes())
    return f"{size}-seed{seed}-{h.hexdigest()[:12]}"


def make_model(size: str = "tiny", seed: int = 0) -> Path:
    """A model dir for tests, created once per code version and reused across sessions."""
    from rollyard.engines.tiny_model import create_model

    path = CACHE / _model_key(size, seed)
    if not (path / "config.json").exists():
        create_model(path, seed=seed, size=size, overwrite=True)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    return make_model("tiny", 0)


@pytest.fixture(scope="session")
def tiny_model_dir_seed1() -> Path:
    return make_model("tiny", 1)


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real vLLM (CPU build) on the tiny model for the whole session.

    ``ROLLYARD_TEST_ENGINE_URL`` points the session at an engine already serving the tiny model
    as ``tiny`` (started by hand on a loaded machine, where start-up can outlast the timeout)."""
    from types import SimpleNamespace

    from rollyard.engines.launcher import VLLMServer

    if os.environ.get("ROLLYARD_TEST_ENGINE_URL"):
        yield SimpleNamespace(url=os.environ["ROLLYARD_TEST_ENGINE_URL"].rstrip("/"))
        return

    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    with VLLMServer(
        tiny_model_dir,
        kv_tokens=ENGINE_KV_TOKENS,
        max_model_len=ENGINE_MAX_MODEL_LEN,
        served_name="tiny",
        log_path=log,
        extra_args=["--logprobs-mode", "processed_logprobs"],  # as a run starts its engines
    ) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_url(vllm_server: object) -> str:
    return vllm_server.url  # type: ignore[attr-defined]
