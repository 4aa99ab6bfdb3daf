"""The journal's disk fills up: a clean 503, nothing half-written, and service resumes with space."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from rollyard.gateway import FastTokenizer, build_gateway, create_app

from .conftest import ADMIN, ScriptedBackend, new_program, trajectory

_libc = ctypes.CDLL(None, use_errno=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Path:
    """A 2 MB tmpfs (root only): a real ENOSPC, not a mocked one."""
    d = tmp_path / "disk"
    d.mkdir()
    if os.geteuid() != 0 or _libc.mount(b"tmpfs", os.fsencode(d), b"tmpfs", 0, b"size=2m") != 0:
        pytest.skip("needs root to mount a small tmpfs")
    yield d
    _libc.umount2(os.fsencode(d), 2)


def test_journal_disk_full_is_a_clean_503_and_service_resumes(
    small_disk: Path, tok: FastTokenizer, engine: ScriptedBackend
) -> None:
    gw = build_gateway({"fake": engine}, tok, small_disk / "journal.db", ADMIN, "tiny")
    with TestClient(create_app(gw, poll_interval_s=0.05)) as c:
        prog = new_program(c)
        key = {"x-api-key": prog["api_key"]}
        msgs = [{"role": "user", "content": "hi"}]
        r = c.post("/v1/chat/completions", json={"messages": msgs}, headers=key)
        assert r.status_code == 200
        msgs.append({"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]})
        filler = small_disk / "filler"
        with open(filler, "wb") as f:  # fill the disk to the last byte
            try:
                while True:
                    f.write(bytes(65536))
                    f.flush()
            except OSError:
                pass
        statuses = []
        for i in range(3):
            r = c.post(
                "/v1/chat/completions",
                json={"messages": [*msgs, {"role": "user", "content": f"q{i}"}]},
                headers=key,
            )
            statuses.append(r.status_code)
            if r.status_code == 503:
                assert r.json()["error"]["code"] == "journal_unavailable" and "retry-after" in r.headers
        assert 503 in statuses and all(s in (200, 503) for s in statuses), statuses
        assert c.get("/health").status_code == 200
        filler.unlink()  # space returns
        r = c.post(
            "/v1/chat/completions",
            json={"messages": [*msgs, {"role": "user", "content": "again"}]},
            headers=key,
        )
        assert r.status_code == 200, r.text
        traj = trajectory(c, prog["id"])
    # Nothing half-written: every recorded turn is whole and the indices are contiguous.
    turns = [t for s in traj["segments"] for t in s["turns"]]
    assert [t["index"] for t in turns] == list(range(len(turns))) and len(turns) >= 2
    assert all(t["prompt_ids"] and t["completion_ids"] for t in turns)
