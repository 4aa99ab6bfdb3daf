"""Benches made of whole training runs, resumable across sessions (``--work DIR``).

``rollyard bench offpolicy`` at full size is ~5 h and ``drafting-eagle`` ~3-4 h on 2 cores: longer
than one session. Under ``--work DIR`` every run's dir lives in DIR and, once the run is finished,
its summary row is written atomically to ``DIR/<run>.json`` with the key of what decides it (bench,
sizes, seed, config, the bench's recipe constants). A later call with the same DIR reuses each row
whose key matches and runs the rest; a row whose key differs is rerun and overwritten. Without
``--work`` the runs live in a temporary directory, as before.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rollyard.bench._report import loadavg
from rollyard.core.errors import ConfigError
from rollyard.rollout.config import Config
from rollyard.rollout.rundir import write_atomic

log = logging.getLogger(__name__)


@contextmanager
def work_dir(work: Path | None, prefix: str) -> Iterator[Path]:
    """``work`` (made if missing, kept after) or a temporary directory removed at the end."""
    if work is None:
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            yield Path(tmp)
        return
    if work.exists() and not work.is_dir():
        raise ConfigError(f"--work {work} is a file: give a directory (made if missing)")
    work.mkdir(parents=True, exist_ok=True)
    yield work


def shed(run_dir: Path, weights: bool = True) -> None:
    """A finished run's trainer checkpoint and (unless ``weights`` is False) published weights:
    a version of SmolLM2 is 0.5 GB and its row needs neither; its metrics and logs stay."""
    shutil.rmtree(run_dir / "checkpoint", ignore_errors=True)
    if weights:
        shutil.rmtree(run_dir / "weights", ignore_errors=True)


def config_hash(cfg: Config) -> str:
    """A short hash of a run's whole config (its paths and engine URL given fixed by the caller):
    part of a row's key, so a changed demo config or default is not mistaken for the same run."""
    dump = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(dump.encode()).hexdigest()[:16]


def _plain(key: dict[str, Any]) -> dict[str, Any]:
    """``key`` as it reads back from JSON (tuples become lists), so a stored key compares equal."""
    return json.loads(json.dumps(key, sort_keys=True))


class Rows:
    """The finished runs' rows of one bench under ``root`` (None: nothing is stored, nothing reused)."""

    def __init__(self, root: Path | None) -> None:
        self.root = root
        self.reused: list[str] = []
        self.measured: dict[str, dict[str, Any]] = {}  # run -> when and under what load

    def load(self, run: str, key: dict[str, Any]) -> dict[str, Any] | None:
        """The stored row of ``run`` if it was made under ``key``; else None (and why, in the log)."""
        if self.root is None:
            return None
        path = self.root / f"{run}.json"
        try:
            doc = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, json.JSONDecodeError) as e:
            log.warning("bench row %s unreadable (%s): the run is redone", path, e)
            return None
        if not isinstance(doc, dict) or doc.get("key") != _plain(key):
            stored = doc.get("key") if isinstance(doc, dict) else None
            log.warning("bench row %s has another key (%s, now %s): the run is redone", path, stored, key)
            return None
        if not isinstance(doc.get("row"), dict) or not isinstance(doc.get("measured"), dict):
            log.warning("bench row %s has no row or measured object: the run is redone", path)
            return None
        self.reused.append(run)
        self.measured[run] = {**doc["measured"], "reused": True}
        log.info("bench row %s reused (measured %s)", run, doc["measured"].get("at"))
        return doc["row"]

    def save(self, run: str, key: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
        """Record ``run``'s row as measured now; to ``root/<run>.json`` (write then rename) if stored.
        The row as it reads back (plain JSON), so a reused row and a new one sum up alike."""
        measured = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "loadavg": loadavg()}
        self.measured[run] = {**measured, "reused": False}
        if self.root is not None:
            doc = {"key": _plain(key), "measured": measured, "row": row}
            write_atomic(self.root / f"{run}.json", json.dumps(doc, indent=2, sort_keys=True))
        return _plain(row)

    def announce(self, bench: str, todo: list[str]) -> None:
        """One line on stderr (stdout's last line is the bench's): what is reused, what runs now."""
        if self.root is not None:
            line = f"work={self.root} reused={','.join(self.reused) or '-'} running={','.join(todo) or '-'}"
            print(f"{bench} {line}", file=sys.stderr, flush=True)

    def details(self) -> dict[str, Any]:
        """What the bench's details say of its rows: which were reused, when each was measured."""
        return {"reused_runs": list(self.reused), "measured": dict(self.measured)}
