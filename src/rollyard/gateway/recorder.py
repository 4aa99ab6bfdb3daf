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

Rows are linear in tokens (``journal_rows``): a turn stores the ids its prompt adds to its
segment's previous turn, packed binary, and a conversation state stores the messages added
since the previous state (``messages`` rows; a new segment writes its messages afresh). So a
commit's work on the loop is O(new tokens) and the file grows with the tokens, not with the
turns x the context. Full prompts are rebuilt on read; ``atrajectory`` reads and rebuilds on a
worker thread with its own connection (WAL readers never block the loop's writer). The
tables and the migration of older journals: ``journal_schema``.
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
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pydantic_core

from rollyard.core.errors import JournalUnavailable
from rollyard.core.program import Program
from rollyard.core.trajectory import Event, Outcome, Trajectory, Turn
from rollyard.gateway.journal_rows import (
    INSERT_TURN,
    TURN_COLUMNS,
    LastTurn,
    Rows,
    iter_rebuild,
    pack_message,
    rebuild,
    trajectory_of,
    trajectory_rows,
    turn_row,
    unpack_message,
)
from rollyard.gateway.journal_schema import PUT_MESSAGE, UPSERT_CONVERSATION, open_schema
from rollyard.gateway.renderer import ConversationState

log = logging.getLogger(__name__)

Statement = tuple[str, tuple[Any, ...]]
# Bytes of rows committed between checkpoints. A row's pages hold more than its text: 1 MB of
# 4 KB rows, one commit each, kept the WAL at 5.8 MB (SQLite's own default: 1000 pages, 4 MB).
CHECKPOINT_BYTES = 1 << 20
REBUILD_SLICE_S = 0.002  # atrajectory's longest hold of the loop between yields


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
        try:
            open_schema(self._db, self.path)
        except BaseException:
            self._db.close()
            raise
        # Per program, what its next turn and state are stored relative to (set when queued,
        # so a turn queued behind its predecessor builds on it; dropped when a commit fails,
        # and then read back from the file).
        self._last_turn: dict[str, LastTurn] = {}
        self._last_state: dict[str, tuple[int, int]] = {}  # segment, messages stored
        # statements, their waiter, and what to undo if they fail (run even if the waiter is gone)
        self._queue: list[tuple[list[Statement], asyncio.Future[None], Callable[[], None] | None]] = []
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
        leftovers = [s for stmts, _, _ in self._queue for s in stmts]
        self._queue = []
        if leftovers:
            self._tx(leftovers)
        with self._lock:
            self._db.close()  # the last connection to close checkpoints and removes the WAL

    def _note_committed(self, statements: list[Statement]) -> None:
        """Count the rows' bytes; past ``checkpoint_bytes``, start a checkpoint unless one runs."""
        self._unchecked += sum(len(a) for _, args in statements for a in args if isinstance(a, (str, bytes)))
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
        if outcome is not None:  # finished
            self._forget(program.id)
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
        out = {}
        with self._lock:
            rows = self._db.execute("SELECT program_id, tools_key, body FROM conversations").fetchall()
            for pid, tools_key, body in rows:
                if only is not None and pid not in only:
                    continue
                state = json.loads(body)
                at, seg = state["turn_index"], state["segment"]
                turns = rebuild(
                    pid,
                    self._db.execute(
                        f"SELECT {TURN_COLUMNS} FROM turns WHERE program_id = ? AND segment = ? "
                        "AND idx <= ? ORDER BY idx",
                        (pid, seg, at),
                    ),
                )
                if not turns or turns[-1][1].index != at or tools_key is None:
                    log.warning("journal: program %s's conversation ends at a turn it does not hold", pid)
                    continue
                n = state.pop("n_messages")
                messages = self._db.execute(
                    "SELECT body FROM messages WHERE program_id = ? AND idx < ? ORDER BY idx", (pid, n)
                ).fetchall()
                turn = turns[-1][1]
                state.update(tools_key=tools_key, messages=[unpack_message(m[0]) for m in messages])
                out[pid] = ConversationState.from_json(state, turn.prompt_ids, turn.completion_ids)
                self._last_turn[pid] = LastTurn.of(turn, seg)
                self._last_state[pid] = (seg, n)
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
        """Durably append the turn, its events, the conversation state and the program row.

        O(new tokens): the turn's prompt is stored past its segment's previous turn and the
        state's messages past the previous state's (``journal_rows``)."""
        pid = program.id
        last = self._last_turn.get(pid) or self._read_last_turn(pid)
        reused = last.reused_by(turn, segment) if last is not None else 0
        seg_n = self._last_state.get(pid)
        since = seg_n[1] if seg_n is not None and seg_n[0] == state.segment else 0
        since = min(since, len(state.messages))
        d = state.to_json(since=since)
        new_messages = d.pop("messages")
        tools_key = d.pop("tools_key") if since == 0 else None  # unchanged within a segment
        d["n_messages"] = len(state.messages)
        stmts: list[Statement] = [
            (INSERT_TURN, turn_row(pid, turn, segment, reused)),
            (UPSERT_CONVERSATION, (pid, tools_key, pydantic_core.to_json(d).decode())),
            ("UPDATE programs SET body = ? WHERE id = ?", (program.model_dump_json(), pid)),
        ]
        stmts += [(PUT_MESSAGE, (pid, since + k, pack_message(m))) for k, m in enumerate(new_messages)]
        stmts += [
            ("INSERT INTO events (program_id, body) VALUES (?, ?)", (pid, e.model_dump_json()))
            for e in events
        ]
        self._last_turn[pid] = LastTurn.of(turn, segment)
        self._last_state[pid] = (state.segment, len(state.messages))
        await self.commit(stmts, on_error=lambda: self._forget(pid))

    def _forget(self, program_id: str) -> None:
        """Drop what the program's next turn would be stored relative to: after a failed commit
        it is read back from the file (``_read_last_turn``; the state's messages are written
        whole), and a finished program takes no more turns."""
        self._last_turn.pop(program_id, None)
        self._last_state.pop(program_id, None)

    def _read_last_turn(self, program_id: str) -> LastTurn | None:
        """The program's latest turn as the file holds it (after a failed commit, or for a
        program whose state was not loaded): one row, O(its new tokens)."""
        with self._lock:
            row = self._db.execute(
                f"SELECT {TURN_COLUMNS} FROM turns WHERE program_id = ? ORDER BY idx DESC LIMIT 1",
                (program_id,),
            ).fetchone()
        return None if row is None else LastTurn.of_row(row)

    async def commit(self, stmts: list[Statement], on_error: Callable[[], None] | None = None) -> None:
        """Return once ``stmts`` are committed (group commit; see the module docstring).

        A caller cancelled while waiting does not un-commit: its statements are already queued.
        ``on_error`` runs if they fail, whether or not the caller still waits.
        """
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self._queue.append((stmts, done, on_error))
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
            self._tx([s for stmts, _, _ in batch for s in stmts])
            results: list[BaseException | None] = [None] * len(batch)
        except (sqlite3.Error, JournalUnavailable):  # find the culprit: one transaction per caller
            results = [self._try_tx(stmts) for stmts, _, _ in batch]
        for (_, done, on_error), err in zip(batch, results, strict=True):
            if err is not None and on_error is not None:
                on_error()
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
        """Rebuild a program's trajectory from the journal (segments validated on the way).
        On the caller's thread, with the loop's connection: from the event loop, ``atrajectory``."""
        with self._lock:
            rows = trajectory_rows(self._db, program_id)
        return trajectory_of(program_id, *rows)

    async def atrajectory(self, program_id: str) -> Trajectory:
        """``trajectory`` without holding the event loop: the rows are read on a worker thread
        with a connection of its own (disk reads; WAL readers never block the writer), and the
        turns are rebuilt on the loop a slice of at most ``REBUILD_SLICE_S`` at a time.

        Why not rebuild on the thread too: the rebuild is Python holding the GIL, so the loop
        still waited for it, and worse, at every hand-over: measured on the shared 2-core
        machine under load average 24, reading a 30k-token trajectory on a thread lagged the
        loop 47-155 ms, more than the 52 ms the whole read took on the loop."""
        prow, rows, events = await asyncio.to_thread(self._rows_apart, program_id)
        turns: list[tuple[int, Turn, bool]] = []
        until = time.perf_counter() + REBUILD_SLICE_S
        for item in iter_rebuild(program_id, rows):
            turns.append(item)
            if time.perf_counter() > until:
                await asyncio.sleep(0)  # let every other task run
                until = time.perf_counter() + REBUILD_SLICE_S
        return trajectory_of(program_id, prow, rows, events, turns)

    def _rows_apart(self, program_id: str) -> Rows:
        db = sqlite3.connect(str(self.path), isolation_level=None)
        try:
            return trajectory_rows(db, program_id)
        finally:
            db.close()

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
