"""The black-box path end to end on real parts: the `rollyard gateway` process (TCP for the
admin, a unix socket for sandboxes) in front of the session's real vLLM, a program registered
through the admin API, and the shipped OpenAI-SDK example agent run by the black-box runner in
a real bubblewrap sandbox. The agent's calls become token-exact turns of its program; from the
sandbox, its key cannot reach an admin route and no host TCP port is reachable at all."""

from __future__ import annotations

import json
from pathlib import Path
from urllib.parse import urlparse

import httpx
import pytest

from rollyard.agents.blackbox import BlackBoxRunner, load_profile
from rollyard.core.trajectory import Trajectory, extends
from rollyard.sandbox.base import SandboxProvider

from .conftest import ADMIN, new_program

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def test_the_socket_is_reachable_by_any_uid_and_grants_nothing_alone(gateway: tuple[str, Path]) -> None:
    _, sock = gateway
    assert oct(sock.parent.stat().st_mode & 0o777) == "0o755"
    assert oct(sock.stat().st_mode & 0o777) == "0o777"
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://gw") as c:
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}]}
        assert c.post("/v1/chat/completions", json=chat).status_code == 401
        # Even the admin token gets no admin route on the sandboxes' socket.
        assert c.get("/programs", headers={"x-api-key": ADMIN}).status_code == 403
        assert c.get("/metrics").status_code == 403
        assert c.get("/health").status_code == 200


async def test_a_sandboxed_sdk_agent_is_recorded_token_exact_and_fenced_in(
    gateway: tuple[str, Path], vllm_url: str, provider: SandboxProvider, tmp_path: Path
) -> None:
    url, sock = gateway
    prog = new_program(url)
    runner = BlackBoxRunner(load_profile("openai"), sock)
    sb = await provider.create(runner.spec())
    try:
        result = await runner.run(sb, task="list the files here", api_key=prog["api_key"], model="tiny")
    finally:
        await sb.close()
    # A random model may end the loop with text or run out of turns; either way it talked to us.
    assert result.rc == 0 or "max turns" in result.stderr, result.stderr

    r = httpx.get(f"{url}/programs/{prog['id']}/trajectory", headers={"x-api-key": ADMIN})
    traj = Trajectory.model_validate(r.json())
    assert traj.num_turns >= 1 and traj.group_id == "g-bb" and traj.task_id == "t-bb"
    for t in traj.turns:
        assert t.prompt_ids and len(t.completion_ids) == len(t.completion_logprobs) > 0
        assert all(lp <= 1e-4 for lp in t.completion_logprobs)
        assert t.sampling["temperature"] == 1.0 and t.sampling["max_tokens"] <= 24
    for seg in traj.segments:  # within a segment each prompt extends the previous prompt + completion
        for a, b in zip(seg.turns, seg.turns[1:], strict=False):
            assert extends(a, b.prompt_ids)

    # From inside a sandbox, with the program's key: admin routes refused, host ports unreachable.
    gw_port, engine_port = urlparse(url).port, urlparse(vllm_url).port
    probe = tmp_path / "probe.yaml"
    script = f"""
import json, os, socket, urllib.request, urllib.error
def call(method, path, body=None):
    req = urllib.request.Request(os.environ["ORIGIN"] + path, method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={{"Authorization": "Bearer " + os.environ["KEY"], "content-type": "application/json"}})
    try:
        return urllib.request.urlopen(req, timeout=30).status
    except urllib.error.HTTPError as e:
        return e.code
out = {{"models": call("GET", "/v1/models"), "create": call("POST", "/programs", {{}}),
       "list": call("GET", "/programs"), "own_trajectory": call("GET", "/programs/{prog["id"]}/trajectory"),
       "finish": call("POST", "/programs/{prog["id"]}/finish", {{}})}}
for name, port in [("gateway_tcp", {gw_port}), ("engine", {engine_port})]:
    s = socket.socket(); s.settimeout(2)
    try:
        s.connect(("127.0.0.1", port)); out[name] = "reached"
    except OSError:
        out[name] = "blocked"
print(json.dumps(out))
"""
    env = {"ORIGIN": "{origin}", "KEY": "{api_key}"}
    probe.write_text(
        json.dumps({"name": "probe", "command": ["python3", "-c", script], "env": env, "task_input": "stdin"})
    )
    prober = BlackBoxRunner(load_profile(probe), sock)
    sb = await provider.create(prober.spec())
    try:
        seen = await prober.run(sb, task="", api_key=prog["api_key"], model="tiny")
    finally:
        await sb.close()
    assert seen.rc == 0, seen.stderr
    out = json.loads(seen.output or "{}")
    assert out["models"] == 200  # the forwarder works: the same key reaches its model endpoint
    assert {out[k] for k in ("create", "list", "own_trajectory", "finish")} == {403}
    assert out["gateway_tcp"] == out["engine"] == "blocked"
    after = httpx.get(f"{url}/programs/{prog['id']}", headers={"x-api-key": ADMIN}).json()
    assert after["state"] == "active"  # the refused finish changed nothing
