"""The journal: programs, turns, events and conversation state in SQLite (WAL).

Each completed turn (turn + its events + the program's conversation state) is committed
before the client sees the answer. WAL makes a committed transaction survive ``kill -9`` of
the process (``synchronous=NORMAL``: only a power loss can drop the last transactions). The
file holds program keys, so it is created 0600.

Turns are written by group commit on the event loop's own thread: ``record_turn`` queues its
statements and waits; a callback scheduled for the loop's next pass commits everything queued
by then in one transaction (no fsync: a WAL commit is a ``write()``), then wakes the waiters.
Why not a worker thread: measured under a loaded 2-core machine, every SQLite call on a worker
re-acquires the GIL from a busy loop (up to the 5 ms switch interval each), and each commit
waits for two thread wake-ups, so turns waited 10-150 ms for a ~1 ms commit.

The one slow step that was left on the loop, SQLite's automatic WAL checkpoint (it copies the
WAL into the database and fsyncs both: about 7 ms per 4 MB journalled, measured here), runs on
a thread of its own instead: the loop's connection has ``wal_autocheckpoint=0``, and after
every ``checkpoint_bytes`` of rows committed a ``PASSIVE`` checkpoint runs on that thread's own
connection (SQLite connections stay on the thread that made them; a PASSIVE checkpoint never
blocks the loop's writers, it copies what no reader still needs). Durability is unchanged: a
commit is durable once in the WAL, whether or not a checkpoint has copied it yet, and a
checkpoint cut short by a crash is redone from the WAL when the file is next opened.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pydantic_core

from rollyard.core.errors import JournalUnavailable, NotFound
from rollyard.core.program import Program
from rollyard.core.trajectory import Event, Outcome, Segment, Trajectory, Turn
from rollyard.gateway.renderer import ConversationState

log = logging.getLogger(__name__)

Statement = tuple[str, tuple[Any, ...]]
# Bytes of rows committed between checkpoints. A row's pages hold more than its text: 1 MB of
# 4 KB rows, one commit each, kept the WAL at 5.8 MB (SQLite's own default: 1000 pages, 4 MB).
CHECKPOINT_BYTES = 1 << 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS programs (id TEXT PRIMARY KEY, body TEXT NOT NULL, outcome TEXT);
CREATE TABLE IF NOT EXISTS turns (
    program_id TEXT NOT NULL, idx INTEGER NOT NULL, segment INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (program_id, idx));
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, program_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_program ON events (program_id);
CREATE TABLE IF NOT EXISTS conversations (program_id TEXT PRIMARY KEY, body TEXT NOT NULL);
"""


class SqliteJournal:
    """Append-only record of what each program's policy saw and produced."""

    def __init__(self, path: str | Path, *, checkpoint_bytes: int = CHECKPOINT_BYTES) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self.path.exists():
            self.path.touch(mode=0o600)
        os.chmod(self.path, 0o600)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute("PRAGMA wal_autocheckpoint=0")  # checkpoints run on _checkpointer
        self._db.executescript(_SCHEMA)
        self._queue: list[tuple[list[Statement], asyncio.Future[None]]] = []
        self._flush_pending = False
        self.checkpoint_bytes = checkpoint_bytes
        self.checkpoints = 0  # completed background checkpoints
        self._unchecked = 0  # bytes of rows committed since the last checkpoint was started
        self._checkpointing = False  # one runs on the checkpoint thread (set on the loop only)
        self._closed = False
        self._checkpointer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="journal-checkpoint")
        self._ckpt_db: sqlite3.Connection | None = None  # opened and used on that thread only

    def close(self) -> None:
        """Commit whatever is still queued (its waiters are gone with their loop), then close.
        Idempotent: an app's lifespan may be run (and closed) by more than one client."""
        if self._closed:
            return
        self._closed = True
        self._checkpointer.submit(self._close_checkpointer).result()  # after a running checkpoint
        self._checkpointer.shutdown()
        leftovers = [s for stmts, _ in self._queue for s in stmts]
        self._queue = []
        if leftovers:
            self._tx(leftovers)
        with self._lock:
            self._db.close()  # the last connection to close checkpoints and removes the WAL

    def _note_committed(self, statements: list[Statement]) -> None:
        """Count the rows' bytes; past ``checkpoint_bytes``, start a checkpoint unless one runs."""
        self._unchecked += sum(len(a) for _, args in statements for a in args if isinstance(a, str))
        if self._unchecked < self.checkpoint_bytes or self._checkpointing or self._closed:
            return
        self._unchecked = 0
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop to keep free (a script): here, as SQLite's own would
            with self._lock, contextlib.suppress(sqlite3.Error):  # the commit stands regardless
                self._db.execute("PRAGMA wal_checkpoint(PASSIVE)")
            return
        self._checkpointing = True
        loop.run_in_executor(self._checkpointer, self._checkpoint).add_done_callback(self._checkpoint_done)

    def _checkpoint(self) -> None:
        """On the checkpoint thread: copy the WAL into the database (``PASSIVE``: never waits)."""
        try:
            if self._ckpt_db is None:
                self._ckpt_db = sqlite3.connect(str(self.path), isolation_level=None)
            busy, frames, copied = self._ckpt_db.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        except sqlite3.Error as e:  # disk full, I/O error: the WAL keeps it; the next one retries
            log.warning("journal checkpoint failed: %s", e)
            return
        self.checkpoints += 1
        log.debug("journal checkpoint wal_frames=%d copied=%d busy=%d", frames, copied, busy)

    def _checkpoint_done(self, _: asyncio.Future[None]) -> None:
        """On the loop: commit what queued up meanwhile (see ``_flush``)."""
        self._checkpointing = False
        if self._queue and not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _close_checkpointer(self) -> None:
        if self._ckpt_db is not None:
            self._ckpt_db.close()
            self._ckpt_db = None

    def _tx(self, statements: list[Statement]) -> None:
        """One transaction, one ``executemany`` per distinct statement.

        Grouping keeps each statement's own order (so one program's turns, events and updates
        land in order) and only reorders across tables, which nothing in one commit depends on.
        """
        by_sql: dict[str, list[tuple[Any, ...]]] = {}
        for sql, args in statements:
            by_sql.setdefault(sql, []).append(args)
        with self._lock:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                for sql, rows in by_sql.items():
                    self._db.executemany(sql, rows)
                self._db.execute("COMMIT")
            except BaseException as e:
                if self._db.in_transaction:  # SQLite may have rolled back already (disk full)
                    self._db.execute("ROLLBACK")
                if isinstance(e, sqlite3.OperationalError):  # disk full, I/O error: not the caller's
                    raise JournalUnavailable(f"the journal cannot write: {e}") from e
                raise
        self._note_committed(statements)

    # programs -------------------------------------------------------------
    def save_program(self, program: Program, outcome: Outcome | None = None) -> None:
        out = outcome.model_dump_json() if outcome is not None else None
        self._tx(
            [
                (
                    "INSERT INTO programs (id, body, outcome) VALUES (?, ?, ?) ON CONFLICT(id) DO UPDATE "
                    "SET body = excluded.body, outcome = COALESCE(excluded.outcome, programs.outcome)",
                    (program.id, program.model_dump_json(), out),
                )
            ]
        )

    def load_programs(self) -> list[Program]:
        with self._lock:
            rows = self._db.execute("SELECT body FROM programs ORDER BY rowid").fetchall()
        return [Program.model_validate_json(r[0]) for r in rows]

    def load_conversations(self, only: set[str] | None = None) -> dict[str, ConversationState]:
        """Each program's conversation state (of the programs in ``only``, if given), its ids
        taken from the turn it ends with. A state whose turn row is missing (a damaged or edited
        journal) is left out, with a warning: the program's next request then renders afresh
        (a new segment), where guessed ids would have made a wrong prompt look like a match."""
        with self._lock:
            rows = self._db.execute(
                "SELECT c.program_id, c.body, t.body FROM conversations c LEFT JOIN turns t "
                "ON t.program_id = c.program_id AND t.idx = json_extract(c.body, '$.turn_index')"
            ).fetchall()
        out = {}
        for pid, body, turn_body in rows:
            if only is not None and pid not in only:
                continue
            state = json.loads(body)
            if turn_body is None and "prompt_ids" not in state:
                log.warning("journal: program %s's conversation ends at a turn it does not hold", pid)
                continue
            turn = json.loads(turn_body) if turn_body is not None else {}
            ids = turn.get("prompt_ids", []), turn.get("completion_ids", [])
            out[pid] = ConversationState.from_json(state, *ids)
        return out

    # turns ----------------------------------------------------------------
    async def record_turn(
        self,
        program: Program,
        turn: Turn,
        segment: int,
        events: list[Event],
        state: ConversationState,
    ) -> None:
        """Durably append the turn, its events, the conversation state and the program row."""
        stmts: list[Statement] = [
            (
                "INSERT INTO turns (program_id, idx, segment, body) VALUES (?, ?, ?, ?)",
                (program.id, turn.index, segment, turn.model_dump_json()),
            ),
            (
                "INSERT INTO conversations (program_id, body) VALUES (?, ?) "
                "ON CONFLICT(program_id) DO UPDATE SET body = excluded.body",
                (program.id, pydantic_core.to_json(state.to_json()).decode()),
            ),
            ("UPDATE programs SET body = ? WHERE id = ?", (program.model_dump_json(), program.id)),
        ]
        stmts += [
            ("INSERT INTO events (program_id, body) VALUES (?, ?)", (program.id, e.model_dump_json()))
            for e in events
        ]
        await self.commit(stmts)

    async def commit(self, stmts: list[Statement]) -> None:
        """Return once ``stmts`` are committed (group commit; see the module docstring).

        A caller cancelled while waiting does not un-commit: its statements are already queued.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((stmts, done))
        if not self._flush_pending:
            self._flush_pending = True
            loop.call_soon(self._flush)
        await done

    def _flush(self) -> None:
        self._flush_pending = False
        if self._checkpointing:
            # Turns wait for the checkpoint (the loop does not): a checkpoint that no commit
            # overlaps copies the whole WAL, so the next commit rewinds it and it stays a few MB.
            # Committing meanwhile left a tail each time; the WAL never rewound and grew to
            # 200 MB for 40 MB of rows, with commits 3x slower.
            return
        batch, self._queue = self._queue, []
        if not batch:
            return
        try:
            self._tx([s for stmts, _ in batch for s in stmts])
            results: list[BaseException | None] = [None] * len(batch)
        except (sqlite3.Error, JournalUnavailable):  # find the culprit: one transaction per caller
            results = [self._try_tx(stmts) for stmts, _ in batch]
        for (_, done), err in zip(batch, results, strict=True):
            if done.done():
                continue
            if err is None:
                done.set_result(None)
            else:
                done.set_exception(err)

    def _try_tx(self, stmts: list[Statement]) -> BaseException | None:
        try:
            self._tx(stmts)
        except (sqlite3.Error, JournalUnavailable) as e:
            return e
        return None

    def record_events(self, program_id: str, events: list[Event]) -> None:
        if events:
            self._tx(
                [
                    ("INSERT INTO events (program_id, body) VALUES (?, ?)", (program_id, e.model_dump_json()))
                    for e in events
                ]
            )

    def trajectory(self, program_id: str) -> Trajectory:
        """Rebuild a program's trajectory from the journal (segments validated on the way)."""
        with self._lock:
            prow = self._db.execute(
                "SELECT body, outcome FROM programs WHERE id = ?", (program_id,)
            ).fetchone()
            turns = self._db.execute(
                "SELECT segment, body FROM turns WHERE program_id = ? ORDER BY idx", (program_id,)
            ).fetchall()
            events = self._db.execute(
                "SELECT body FROM events WHERE program_id = ? ORDER BY seq", (program_id,)
            ).fetchall()
        if prow is None:
            raise NotFound(f"no program {program_id!r}")
        program = Program.model_validate_json(prow[0])
        segments: list[Segment] = []
        last = None
        for seg, body in turns:
            if seg != last:
                segments.append(Segment())
                last = seg
            segments[-1].turns.append(Turn.model_validate_json(body))
        return Trajectory(
            id=f"traj_{program.id.removeprefix('prog_')}",
            program_id=program.id,
            group_id=program.group_id,
            task_id=program.task_id,
            segments=[Segment.model_validate(s.model_dump()) for s in segments],
            events=[Event.model_validate_json(e[0]) for e in events],
            outcome=Outcome.model_validate_json(prow[1]) if prow[1] else None,
            metadata={"program": program.public()},
        )

    def program_ids(self, group_id: str | None = None) -> list[str]:
        with self._lock:
            rows = self._db.execute("SELECT id, body FROM programs ORDER BY rowid").fetchall()
        return [pid for pid, body in rows if group_id is None or json.loads(body)["group_id"] == group_id]

    def turn_count(self, program_id: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT COUNT(*) FROM turns WHERE program_id = ?", (program_id,)
            ).fetchone()
        return int(row[0])
