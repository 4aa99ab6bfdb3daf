"""Schemathesis against the gateway's own ``/openapi.json`` (scripted engine): whatever the
schema lets a client send to any operation, the gateway never answers 5xx.

Each operation's cases come from schemathesis's strategy and run under Hypothesis directly
(its pytest plugin does not run under pytest 9 yet). The example count is bounded
(``MAX_EXAMPLES`` per operation) so this stays well under a minute; ``test_fuzz.py`` mutates
real requests beyond what the schema describes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error

from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.gateway.settings import GatewayLimits

from .conftest import ADMIN, ScriptedBackend

MAX_EXAMPLES = 10


@pytest.fixture(scope="module")
def served(tok: FastTokenizer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, str]]:
    db = tmp_path_factory.mktemp("st") / "j.db"
    app = create_app(
        build_gateway({"fake": ScriptedBackend(tok)}, tok, db, ADMIN, "tiny"),
        limits=GatewayLimits(error_budget=0),
    )
    with TestClient(app) as c:  # the app's lifespan runs (engine probe, pollers)
        key = str(c.post("/programs", json={}, headers={"x-api-key": ADMIN}).json()["api_key"])
        yield app, key


def test_no_operation_answers_5xx(served: tuple[Any, str]) -> None:
    app, key = served
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [r.ok() for r in schema.get_all_operations()]
    assert any(op.path == "/v1/chat/completions" for op in operations)
    for op in operations:
        admin = op.path.startswith("/programs") or op.path == "/metrics"
        run(op, {"x-api-key": ADMIN if admin else key})


def run(op: Any, headers: dict[str, str]) -> None:
    """``MAX_EXAMPLES`` cases of one operation; a failure is reported as found (no shrinking:
    the first example already names the operation and the body)."""

    @given(case=op.as_strategy())
    @settings(
        max_examples=MAX_EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
        phases=[Phase.explicit, Phase.generate],
    )
    def one(case: Any) -> None:
        case.validate_response(case.call(headers=headers), checks=[not_a_server_error])

    one()
