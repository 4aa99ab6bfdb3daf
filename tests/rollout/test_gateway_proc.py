"""The run's gateway in its own process: driven only through its admin API, in a session of its
own (a terminal's Ctrl-C reaches the run, which stops it in order), and gone with the run's
process even when that process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import openai

from gateway.conftest import serving  # type: ignore[import-not-found]
from rollyard.core.events import Event, EventKind
from rollyard.core.program import Program, ProgramState, SamplingPolicy
from rollyard.engines.canned import make_app as canned_engine
from rollyard.gateway.recorder import SqliteJournal
from rollyard.rollout.gateway_proc import start_gateway
from rollyard.rollout.remote_fence import RemoteFenced

from .conftest import quick_config


async def test_the_run_drives_its_gateway_process_through_the_admin_api(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    with serving(canned_engine(max_model_len=2048)) as engine:
        cfg = quick_config(tiny_model_dir, engine)
        backends = [RemoteFenced(engine, name="engine0", max_model_len=2048, policy_version=5)]
        (tmp_path / "logs").mkdir()
        gw = await start_gateway(cfg, tmp_path, backends, tiny_model_dir)
        try:
            assert os.getsid(gw.proc.pid) != os.getsid(0)  # Ctrl-C in the terminal is the run's
            assert backends[0].gateway is gw.client  # fences are taken from the gateway now
            sampling = SamplingPolicy(max_tokens=5)
            program, shard = await gw.client.create(Program(group_id="g", task_id="t", sampling=sampling))
            assert shard == 0  # one gateway process: one shard
            client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=program.api_key)
            await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}])
            tool = Event(kind=EventKind.NOTE, turn_index=0, at=1.0, data={"from": "the agent's side"})
            await gw.client.record_events(program.id, [tool])
            await gw.client.finish(program.id, ProgramState.FINISHED, "success")
            traj = await gw.client.trajectory(program.id)
            assert traj.num_turns == 1 and traj.segments[0].turns[0].policy_version == 5
            assert any(e.data.get("from") == "the agent's side" for e in traj.events)
            engines = await gw.client.engines()
            assert engines["data"][0]["version"] == 5 and engines["loop_lag_max_ms"] >= 0
        finally:
            await gw.stop()
        assert gw.proc.returncode is not None
        journal = SqliteJournal(tmp_path / "journal.db")  # closed cleanly: readable, whole
        try:
            assert journal.trajectory(program.id).num_turns == 1
        finally:
            journal.close()


CHILD = textwrap.dedent(
    """
    import asyncio, sys, time
    from pathlib import Path
    sys.path.insert(0, sys.argv[4])
    from rollyard.rollout.gateway_proc import start_gateway
    from rollyard.rollout.remote_fence import RemoteFenced
    from rollout.conftest import quick_config

    async def main():
        engine, model, out = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
        backends = [RemoteFenced(engine, name="engine0", max_model_len=2048)]
        gw = await start_gateway(quick_config(model, engine), out, backends, model)
        (out / "pid").write_text(str(gw.proc.pid))
        time.sleep(600)

    asyncio.run(main())
    """
)


def test_the_gateway_process_ends_when_the_runs_process_is_killed(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    (tmp_path / "logs").mkdir()
    tests = str(Path(__file__).parents[1])
    with serving(canned_engine(max_model_len=2048)) as engine:
        run = subprocess.Popen(
            [sys.executable, "-c", CHILD, engine, str(tiny_model_dir), str(tmp_path), tests]
        )
        try:
            deadline = time.monotonic() + 120
            while not (tmp_path / "pid").exists():
                assert run.poll() is None and time.monotonic() < deadline
                time.sleep(0.2)
            pid = int((tmp_path / "pid").read_text())
            assert Path(f"/proc/{pid}").exists()
            os.kill(run.pid, signal.SIGKILL)  # no teardown at all
            run.wait(10)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not Path(f"/proc/{pid}").exists()
        finally:
            run.kill()


async def test_a_restarted_shard_stamps_the_version_served_now(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``gateway.workers: 2``: after a publish the run writes the live versions into the gateway's
    spec, so a shard the supervisor restarts does not go back to the run's first version."""
    import httpx

    from gateway.test_shards import _listener_pid  # type: ignore[import-not-found]

    with serving(canned_engine(max_model_len=2048)) as engine:
        cfg = quick_config(tiny_model_dir, engine, **{"gateway.workers": 2})
        backends = [RemoteFenced(engine, name="engine0", max_model_len=2048, policy_version=1)]
        (tmp_path / "logs").mkdir()
        gw = await start_gateway(cfg, tmp_path, backends, tiny_model_dir)
        try:
            backends[0].commit(7)  # what a publish leaves: the engine serves version 7
            gw.note_versions(backends)
            port = gw.layout.port_of(1)
            old = _listener_pid(port)
            os.kill(old, signal.SIGKILL)
            admin = {"Authorization": f"Bearer {gw.admin_token}"}
            deadline = time.monotonic() + 60
            version = None
            while time.monotonic() < deadline:
                try:
                    if _listener_pid(port) == old:  # not gone yet
                        raise AssertionError
                    version = httpx.get(f"{gw.url_of(1)}/engines", headers=admin).json()["data"][0]["version"]
                    break
                except (AssertionError, httpx.HTTPError, KeyError):
                    time.sleep(0.3)
            assert version == 7
        finally:
            await gw.stop()
