"""The journal's tables, and the migration of a journal written before turns stored only their
new tokens (schema 1: every turn's whole prompt as JSON, every conversation state whole).

``PRAGMA user_version`` holds the schema: 0 on a file no rollyard wrote to (or a schema-1 one,
which never set it), 2 now. A schema-1 journal is migrated when it is opened, in one
transaction: a crash part-way leaves it as it was, and the next open migrates it again. A
journal from a newer rollyard is refused with a ``ConfigError`` (nothing is changed in it).
"""

from __future__ import annotations

import json
import logging
import sqlite3

from rollyard.core.errors import ConfigError
from rollyard.core.trajectory import Turn
from rollyard.gateway.journal_rows import INSERT_TURN, pack_message, turn_row

log = logging.getLogger(__name__)

VERSION = 2

SCHEMA = """
CREATE TABLE IF NOT EXISTS programs (id TEXT PRIMARY KEY, body TEXT NOT NULL, outcome TEXT);
CREATE TABLE IF NOT EXISTS turns (
    program_id TEXT NOT NULL, idx INTEGER NOT NULL, segment INTEGER NOT NULL,
    reused INTEGER NOT NULL, prompt_len INTEGER NOT NULL, prompt_tail BLOB NOT NULL,
    completion_ids BLOB NOT NULL, completion_logprobs BLOB NOT NULL, meta TEXT NOT NULL,
    PRIMARY KEY (program_id, idx));
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, program_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_program ON events (program_id);
CREATE TABLE IF NOT EXISTS conversations (
    -- tools_key: set by a segment's first state (NULL in a later state's row: unchanged)
    program_id TEXT PRIMARY KEY, tools_key TEXT, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS messages (
    program_id TEXT NOT NULL, idx INTEGER NOT NULL, body NOT NULL,  -- JSON text, or zlib'd JSON
    PRIMARY KEY (program_id, idx));
"""

# Schema 1, as rollyard wrote it before: kept to build old journals in the migration's test and
# the size bench's baseline.
SCHEMA_V1 = """
CREATE TABLE IF NOT EXISTS programs (id TEXT PRIMARY KEY, body TEXT NOT NULL, outcome TEXT);
CREATE TABLE IF NOT EXISTS turns (
    program_id TEXT NOT NULL, idx INTEGER NOT NULL, segment INTEGER NOT NULL, body TEXT NOT NULL,
    PRIMARY KEY (program_id, idx));
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, program_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_program ON events (program_id);
CREATE TABLE IF NOT EXISTS conversations (program_id TEXT PRIMARY KEY, body TEXT NOT NULL);
"""

UPSERT_CONVERSATION = (
    "INSERT INTO conversations (program_id, tools_key, body) VALUES (?, ?, ?) ON CONFLICT(program_id) "
    "DO UPDATE SET body = excluded.body, tools_key = COALESCE(excluded.tools_key, conversations.tools_key)"
)
PUT_MESSAGE = "INSERT OR REPLACE INTO messages (program_id, idx, body) VALUES (?, ?, ?)"


def open_schema(db: sqlite3.Connection, path: object) -> None:
    """Create the tables on a new file, migrate a schema-1 one, refuse a newer one."""
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > VERSION:
        raise ConfigError(
            f"the journal {path} has schema {version}, written by a newer rollyard than this one "
            f"(schema {VERSION}); read it with that version"
        )
    if version == VERSION:
        return
    db.execute("BEGIN IMMEDIATE")  # executescript would commit first: one statement at a time
    try:
        old = "body" in {r[1] for r in db.execute("PRAGMA table_info(turns)")}
        if old:
            db.execute("ALTER TABLE turns RENAME TO turns_v1")
            db.execute("ALTER TABLE conversations RENAME TO conversations_v1")
        for statement in SCHEMA.split(";"):
            if statement.strip():
                db.execute(statement)
        if old:
            _migrate_v1(db, path)
        db.execute(f"PRAGMA user_version = {VERSION}")
        db.execute("COMMIT")
    except BaseException:
        if db.in_transaction:
            db.execute("ROLLBACK")
        raise


def _migrate_v1(db: sqlite3.Connection, path: object) -> None:
    """Schema-1 rows into schema 2 (inside the caller's transaction), then drop the old tables.

    A turn is stored as an extension of the previous one only where its prompt really starts
    with that turn's prompt + completion (checked whole: a migration runs once)."""
    pids = [r[0] for r in db.execute("SELECT DISTINCT program_id FROM turns_v1")]
    turns = 0
    for pid in pids:
        prev: tuple[int, int, list[int]] | None = None  # segment, index, prompt + completion
        rows = db.execute("SELECT segment, body FROM turns_v1 WHERE program_id = ? ORDER BY idx", (pid,))
        for seg, body in rows.fetchall():
            turn = Turn.model_validate_json(body)
            p = turn.prompt_ids
            reused = 0
            if prev is not None and prev[0] == seg and prev[1] == turn.index - 1:
                n = len(prev[2])
                reused = n if p[:n] == prev[2] else 0
            db.execute(INSERT_TURN, turn_row(pid, turn, seg, reused))
            prev = (seg, turn.index, p + turn.completion_ids)
            turns += 1
    for pid, body in db.execute("SELECT program_id, body FROM conversations_v1").fetchall():
        state = json.loads(body)
        messages = state.pop("messages")
        for key in ("prompt_ids", "completion_ids"):  # the oldest journals' own copy: the turn has them
            state.pop(key, None)
        tools_key = state.pop("tools_key")
        state["n_messages"] = len(messages)
        db.execute(UPSERT_CONVERSATION, (pid, tools_key, json.dumps(state)))
        db.executemany(PUT_MESSAGE, [(pid, i, pack_message(m)) for i, m in enumerate(messages)])
    db.execute("DROP TABLE turns_v1")
    db.execute("DROP TABLE conversations_v1")
    log.info("journal %s migrated to schema %d: %d turns of %d programs", path, VERSION, turns, len(pids))
