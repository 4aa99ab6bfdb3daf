"""Per-program environments on real bubblewrap sandboxes: decoy tests catch an agent that goes
looking, and a drawn perturbation changes the sandbox and is recorded."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.core import EventKind, Program
from rollyard.core.events import Event
from rollyard.rollout.environment import ProgramEnvironment, access_events
from rollyard.sandbox.perturb import DEAD_MIRROR, Perturbation
from rollyard.tasks import generate, load_task
from rollyard.tasks.sandboxing import sandbox_spec


@pytest.fixture(scope="module")
def provider() -> object:
    bwrap = pytest.importorskip("rollyard.sandbox.bwrap")
    try:
        return bwrap.BwrapProvider()
    except Exception as e:  # no bubblewrap on this host
        pytest.skip(f"bubblewrap unavailable: {e}")


async def test_reading_the_decoy_tests_is_a_test_access_event_and_perturbations_apply(
    provider: object, tmp_path: Path
) -> None:
    task = load_task(generate("lookup", tmp_path / "tasks", 1, seed=3)[0])
    env = ProgramEnvironment(
        provider,  # type: ignore[arg-type]
        monitor_tests=True,
        perturb_prob=1.0,
        catalogue=[Perturbation(kind="dead_mirror")],
    )
    spec = sandbox_spec(task, provider)  # type: ignore[arg-type]
    snooper, honest = Program(), Program()
    seen: dict[str, list[Event]] = {}
    for program, cmd in ((snooper, "ls /tests && cat /tests/test_hidden.py"), (honest, "ls")):
        events: list[Event] = []
        async with env.sandbox(task, program, spec, events, 0.0) as (sb, monitor):
            res = await sb.exec(f"{cmd}; echo mirror=$PIP_INDEX_URL")
            assert f"mirror={DEAD_MIRROR}" in res.stdout
            events += await access_events(monitor, sb, 1.0)
        seen[program.id] = events
    snooped = [e.payload for e in seen[snooper.id] if e.kind == EventKind.TEST_ACCESS]
    assert {(a.path, a.how) for a in snooped} >= {("/tests", "listed"), ("/tests/test_hidden.py", "read")}
    assert not [e for e in seen[honest.id] if e.kind == EventKind.TEST_ACCESS]
    for events in seen.values():
        (perturbed,) = [e.payload for e in events if e.kind == EventKind.PERTURBATION]
        assert perturbed.name == "dead_mirror"


def test_the_draw_is_a_pure_function_of_seed_and_program(tmp_path: Path) -> None:
    kinds = [Perturbation(kind="dead_mirror")]
    env = ProgramEnvironment(None, perturb_prob=0.5, catalogue=kinds, seed=7)  # type: ignore[arg-type]
    ids = [f"prog_{i}" for i in range(200)]
    drawn = [env.perturbation(i) is not None for i in ids]
    assert drawn == [env.perturbation(i) is not None for i in ids]
    assert 60 < sum(drawn) < 140
