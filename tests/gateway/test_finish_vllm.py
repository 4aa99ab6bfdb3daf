"""Finishing a program while its requests are in flight, on a real vLLM: the turn at the engine
is answered and journaled, those queued behind it get 409, never a 5xx (issue 45, class 3)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollyard.engines import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app

from .conftest import ADMIN, serving
from .test_hostile import finish_while_in_flight

pytestmark = [pytest.mark.engine]


@pytest.fixture(scope="module")
def gateway(vllm_url: str, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("finish") / "journal.db"
    gw = build_gateway(
        {"vllm": VLLMBackend(vllm_url, name="vllm")}, FastTokenizer(tiny_model_dir), db, ADMIN, "tiny"
    )
    with serving(create_app(gw, poll_interval_s=0.5)) as url:
        yield url


@pytest.mark.parametrize("stream", [False, True])
def test_finish_with_requests_in_flight_on_vllm(gateway: str, stream: bool) -> None:
    hi = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 96, "stream": stream}
    finish_while_in_flight(gateway, hi, at_engine_s=0.3)
