"""Real third-party agent CLIs, unmodified, in a bubblewrap sandbox against the real gateway.

Each CLI is installed once with `rollyard agents install` into the repository's ``.cache``
(what CI keeps between its own steps; a first install downloads from PyPI or npm), then run by
its shipped runner profile with the program's key. Whatever a random tiny model answers, the
CLI's calls must reach the gateway through its own API and be recorded token-exact."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from rollyard.agents.blackbox import BlackBoxRunner, load_profile
from rollyard.agents.blackbox.runner import RunResult
from rollyard.agents.install import CLIS, install, installed, require
from rollyard.core.errors import ConfigError
from rollyard.core.trajectory import Trajectory, extends
from rollyard.sandbox.base import SandboxProvider

from .conftest import ADMIN, new_program

CACHE = Path(__file__).resolve().parents[2] / ".cache" / "rollyard"


@pytest.fixture(scope="module")
def agent_cache() -> Iterator[Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLYARD_CACHE", os.environ.get("ROLLYARD_CACHE", str(CACHE)))
        yield Path(os.environ["ROLLYARD_CACHE"])


def test_a_cli_that_is_not_installed_is_a_clear_error_naming_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE", str(tmp_path))
    assert not installed("mini-swe-agent")
    with pytest.raises(ConfigError, match="rollyard agents install mini-swe-agent"):
        require("mini-swe-agent")
    with pytest.raises(ConfigError, match="rollyard agents install mini-swe-agent"):
        BlackBoxRunner(load_profile("mini-swe-agent"), tmp_path / "gw.sock").spec()
    with pytest.raises(ConfigError, match="unknown agent CLI 'nope'; choose one of"):
        install("nope")
    assert not list(tmp_path.iterdir())  # nothing half-installed


def test_every_installable_cli_has_a_shipped_profile() -> None:
    assert {load_profile(name).install for name in CLIS} == set(CLIS)


def trajectory(url: str, program_id: str) -> Trajectory:
    r = httpx.get(f"{url}/programs/{program_id}/trajectory", headers={"x-api-key": ADMIN})
    return Trajectory.model_validate(r.json())


def assert_token_exact(traj: Trajectory) -> None:
    for t in traj.turns:
        assert t.prompt_ids and len(t.completion_ids) == len(t.completion_logprobs) > 0
    for seg in traj.segments:
        for a, b in zip(seg.turns, seg.turns[1:], strict=False):
            assert extends(a, b.prompt_ids)


async def run_cli(
    name: str, gateway: tuple[str, Path], provider: SandboxProvider
) -> tuple[RunResult, Trajectory]:
    install(name)
    url, sock = gateway
    prog = new_program(url)
    runner = BlackBoxRunner(load_profile(name), sock)
    sb = await provider.create(runner.spec())
    try:
        res = await runner.run(sb, task="Print the word hello.", api_key=prog["api_key"], model="tiny")
    finally:
        await sb.close()
    return res, trajectory(url, str(prog["id"]))


@pytest.mark.engine
@pytest.mark.slow
async def test_mini_swe_agent_runs_sandboxed_and_its_calls_are_recorded(
    agent_cache: Path, gateway: tuple[str, Path], provider: SandboxProvider
) -> None:
    res, traj = await run_cli("mini-swe-agent", gateway, provider)
    # It asked through chat completions with its bash tool, and every call was recorded.
    assert traj.num_turns >= 1, (res.rc, res.stdout[-1500:], res.stderr[-1500:])
    assert_token_exact(traj)


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.parametrize(("name", "path"), [("codex", "/v1/responses"), ("claude-code", "/v1/messages")])
async def test_npm_clis_reach_the_gateway_through_their_own_api_and_a_refusal_is_journaled(
    agent_cache: Path, gateway: tuple[str, Path], provider: SandboxProvider, name: str, path: str
) -> None:
    """Their system prompts (Codex ~10k tokens, Claude Code ~31k) exceed the session engine's
    2,048-token context: each call is refused with a 400 in the API's own terms, the CLI exits
    non-zero, and the program's trajectory holds the refusals (size included), not nothing."""
    res, traj = await run_cli(name, gateway, provider)
    assert res.rc != 0 and traj.num_turns == 0
    refused = [e.data for e in traj.events if e.kind == "request_error"]
    assert refused, (res.stdout[-1500:], res.stderr[-1500:])
    for e in refused:
        assert e["path"] == path and e["status"] == 400 and e["code"] == "context_length_exceeded"
        assert e["body_bytes"] > 10_000 and "context limit is 2048 tokens" in e["message"]
