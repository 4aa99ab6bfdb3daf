"""Gateway shards (``rollyard gateway --workers N``): where programs live, each shard's share of
the engines, and that a sharded gateway records exactly what one gateway does."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from rollyard.core.net import free_ports
from rollyard.core.program import Program
from rollyard.core.tables import read_parquet
from rollyard.engines.base import EngineStats
from rollyard.engines.canned import make_app as canned_engine
from rollyard.gateway.app import build_gateway, create_app
from rollyard.gateway.serve import export_group
from rollyard.gateway.shards import ShardLayout, journals_in, shard_of, shared_capacity
from rollyard.gateway.tokenizer import FastTokenizer

from .conftest import ScriptedBackend, serving

ADMIN = "shard-test-admin"


def test_a_program_lives_where_its_group_hashes_and_lone_programs_spread() -> None:
    layout = ShardLayout(count=4, port=9000)
    assert shard_of("group:g1", 4) == shard_of("group:g1", 4)  # stable, not Python's salted hash
    # a group's programs share a shard whatever their ids
    assert len({layout.owner(Program().id, "g1", 8) for _ in range(50)}) == 1
    spread = collections.Counter(layout.owner(Program().id, "default", 1) for _ in range(2000))
    assert set(spread) == {0, 1, 2, 3} and min(spread.values()) > 400  # ~500 each
    assert ShardLayout(count=1).owner("x", "g", 8) == 0


def test_each_shard_has_its_own_port_socket_and_journal(tmp_path: Path) -> None:
    layout = ShardLayout(count=3, port=9000, uds=tmp_path / "gw.sock")
    assert [layout.port_of(k) for k in range(3)] == [9000, 9001, 9002]
    assert layout.uds_of(2) == tmp_path / "gw-2.sock"
    assert layout.journal_of(tmp_path, 1) == tmp_path / "journal-1.db"
    one = ShardLayout(port=9000, uds=tmp_path / "gw.sock")  # one gateway: today's names
    assert one.uds_of(0) == tmp_path / "gw.sock" and one.journal_of(tmp_path, 0) == tmp_path / "journal.db"
    for k in (0, 1, 10):
        (tmp_path / f"journal-{k}.db").touch()
    (tmp_path / "journal-x.db").touch()
    assert [p.name for p in journals_in(tmp_path)] == ["journal-0.db", "journal-1.db", "journal-10.db"]
    assert journals_in(tmp_path / "journal-1.db") == [tmp_path / "journal-1.db"]
    assert journals_in(tmp_path / "missing") == []
    with pytest.raises(Exception, match="shard 3 is not one of 3"):
        ShardLayout(count=3, index=3)


def test_shards_split_every_engine_so_their_budgets_never_sum_past_it(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    assert [shared_capacity(256, 1 / n) * n <= 256 for n in (1, 2, 3, 7)] == [True] * 4
    assert shared_capacity(1, 1 / 4) == 1  # every shard can send at least one request

    class Stats(ScriptedBackend):
        async def stats(self) -> EngineStats:
            return EngineStats(kv_usage=0.1, kv_capacity_tokens=10_001)

    gw = build_gateway({"e0": Stats(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny", capacity=256, share=1 / 3)
    with TestClient(create_app(gw)):
        view = gw.pool.scheduler.state.engines["e0"]
        assert view.capacity == 85 and view.kv_capacity_tokens == 3333  # 3 x each <= the engine's


def test_a_creation_another_shard_owns_is_sent_there_and_a_dead_owner_is_a_503(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    closed = free_ports(2)  # nothing listens on port + 1: shard 1 is down
    layout = ShardLayout(count=2, index=0, port=closed)
    gw = build_gateway({"e0": ScriptedBackend(tok)}, tok, tmp_path / "j.db", ADMIN, "tiny", share=0.5)
    ids = [f"p{i}" for i in range(40)]
    mine = next(i for i in ids if layout.owner(i, "default", 1) == 0)
    theirs = next(i for i in ids if layout.owner(i, "default", 1) == 1)
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with TestClient(create_app(gw, layout=layout)) as client:
        r = client.post("/programs", json={"id": mine}, headers=auth)
        assert r.status_code == 201 and r.json()["shard"] == 0
        r = client.post("/programs", json={"id": theirs}, headers=auth)
        assert r.status_code == 503, r.text
        assert "gateway shard 1" in r.json()["error"]["message"]
        with pytest.raises(Exception, match="no program"):
            gw.programs.get(theirs)  # nothing half-created here


# -- real processes --------------------------------------------------------------------------


def _listener_pid(port: int) -> int:
    """The pid of the process listening on 127.0.0.1:``port`` (from /proc: no extra package)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        if f[3] == "0A" and int(f[1].split(":")[1], 16) == port:  # 0A: LISTEN
            inodes.add(f[9])
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            for fd in (proc / "fd").iterdir():
                if os.readlink(fd) in {f"socket:[{i}]" for i in inodes}:
                    return int(proc.name)
    raise AssertionError(f"nothing listens on {port}")


@contextlib.contextmanager
def sharded_gateway(engine: str, model_dir: Path, state: Path, workers: int) -> Iterator[str]:
    port = free_ports(workers)
    cmd = [sys.executable, "-m", "rollyard", "gateway", "--engine", engine, "--port", str(port)]
    cmd += ["--model-dir", str(model_dir), "--model-name", "tiny", "--state-dir", str(state)]
    cmd += ["--workers", str(workers)]
    proc = subprocess.Popen(cmd, env={**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}, stdout=subprocess.DEVNULL)
    try:
        for k in range(workers):
            _wait_healthy(f"http://127.0.0.1:{port + k}", proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], timeout_s: float = 90) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        assert proc.poll() is None, "the gateway exited during start-up"
        time.sleep(0.1)
    raise AssertionError(f"{url} never became healthy")


def _workload(url: str) -> dict[str, int]:
    """Ten programs (three groups of two, four alone), three turns each; where each lives."""
    auth = {"Authorization": f"Bearer {ADMIN}"}
    specs = [(f"w{i}", f"g{i // 2}", 2) for i in range(6)] + [(f"w{i}", "default", 1) for i in range(6, 10)]
    shards = {}
    for pid, group, size in specs:
        body = {"id": pid, "group_id": group, "group_size": size, "sampling": {"max_tokens": 6}}
        made = httpx.post(f"{url}/programs", json=body, headers=auth, timeout=30)
        assert made.status_code == 201, made.text
        shards[pid] = made.json()["shard"]
        client = openai.OpenAI(base_url=made.json()["base_urls"]["openai"], api_key=made.json()["api_key"])
        messages: list[Any] = [{"role": "user", "content": f"task {pid}"}]
        for turn in range(3):
            answer = client.chat.completions.create(model="tiny", messages=messages, temperature=0)
            messages += [answer.choices[0].message.model_dump(exclude_none=True)]
            messages += [{"role": "user", "content": f"turn {turn} of {pid}"}]
        # any shard's admin API reaches every program: shard 0's is asked for all of them
        done = httpx.post(f"{url}/programs/{pid}/finish", json={"status": "ok"}, headers=auth, timeout=30)
        assert done.status_code == 200 and done.json()["state"] == "finished", done.text
        traj = httpx.get(f"{url}/programs/{pid}/trajectory", headers=auth, timeout=30).json()
        assert sum(len(s["turns"]) for s in traj["segments"]) == 3
    listed = httpx.get(f"{url}/programs", headers=auth, timeout=30).json()["data"]
    assert [p["id"] for p in listed] == [pid for pid, _, _ in specs]  # all shards', oldest first
    missing = httpx.get(f"{url}/programs/nobody", headers=auth, timeout=30)
    assert missing.status_code == 404, missing.text
    return shards


def _comparable(path: Path) -> list[dict[str, Any]]:
    """The exported trajectories, less what differs between any two runs (wall-clock times)."""
    out = []
    for t in read_parquet(path):
        d = t.model_dump(mode="json")
        d["metadata"]["program"].pop("created_at")
        d["metadata"]["program"].pop("finished_at")
        for seg in d["segments"]:
            for turn in seg["turns"]:
                turn.pop("timings")
        for e in d["events"]:
            e.pop("at")
        out.append(d)
    return out


@pytest.mark.slow
def test_two_shards_record_exactly_what_one_gateway_does(tiny_model_dir: Path, tmp_path: Path) -> None:
    with serving(canned_engine(max_model_len=2048)) as engine:
        with sharded_gateway(engine, tiny_model_dir, tmp_path / "one", 1) as url:
            assert set(_workload(url).values()) == {0}
        with sharded_gateway(engine, tiny_model_dir, tmp_path / "two", 2) as url:
            shards = _workload(url)
    assert set(shards.values()) == {0, 1}  # both shards own programs
    for g in range(3):  # a group's two programs live together
        assert shards[f"w{2 * g}"] == shards[f"w{2 * g + 1}"]
    assert [p.name for p in journals_in(tmp_path / "two")] == ["journal-0.db", "journal-1.db"]
    export_group(tmp_path / "one", None, tmp_path / "one.parquet")
    export_group(tmp_path / "two", None, tmp_path / "two.parquet")
    one, two = _comparable(tmp_path / "one.parquet"), _comparable(tmp_path / "two.parquet")
    assert len(one) == 10 and sum(len(s["turns"]) for t in one for s in t["segments"]) == 30
    assert one == two


@pytest.mark.slow
def test_a_killed_shard_comes_back_with_its_programs_and_shards_end_with_the_supervisor(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    auth = {"Authorization": f"Bearer {ADMIN}"}
    with serving(canned_engine(max_model_len=2048)) as engine:
        port = free_ports(2)
        cmd = [sys.executable, "-m", "rollyard", "gateway", "--engine", engine, "--port", str(port)]
        cmd += ["--model-dir", str(tiny_model_dir), "--state-dir", str(tmp_path), "--workers", "2"]
        proc = subprocess.Popen(
            cmd, env={**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}, stdout=subprocess.DEVNULL
        )
        try:
            for k in range(2):
                _wait_healthy(f"http://127.0.0.1:{port + k}", proc)
            pid = next(
                f"p{i}" for i in range(40) if ShardLayout(2, 0, port).owner(f"p{i}", "default", 1) == 1
            )
            made = httpx.post(
                f"http://127.0.0.1:{port}/programs",
                json={"id": pid, "sampling": {"max_tokens": 6}},
                headers=auth,
            ).json()
            client = openai.OpenAI(
                base_url=made["base_urls"]["openai"], api_key=made["api_key"], max_retries=0
            )
            first = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}])
            shard1 = _listener_pid(port + 1)
            os.kill(shard1, signal.SIGKILL)
            time.sleep(0.5)
            _wait_healthy(f"http://127.0.0.1:{port + 1}", proc)  # the supervisor started it again
            assert _listener_pid(port + 1) != shard1
            history = [
                {"role": "user", "content": "a"},
                first.choices[0].message.model_dump(exclude_none=True),
            ]
            client.chat.completions.create(
                model="tiny", messages=[*history, {"role": "user", "content": "b"}]
            )
            traj = httpx.get(f"http://127.0.0.1:{port}/programs/{pid}/trajectory", headers=auth).json()
            assert len(traj["segments"]) == 1 and len(traj["segments"][0]["turns"]) == 2  # it carried on
            shards = [_listener_pid(port), _listener_pid(port + 1)]
        finally:
            proc.kill()  # no clean stop: the shards must still go
            proc.wait(10)
        deadline = time.monotonic() + 20
        while any(Path(f"/proc/{p}").exists() for p in shards) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(Path(f"/proc/{p}").exists() for p in shards)
