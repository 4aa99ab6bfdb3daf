"""The journal's bytes per new token: a multi-turn agent conversation recorded by the gateway's
own code (``Renderer.render``, ``build_turn``, ``SqliteJournal.record_turn``) into a real
journal, the bytes the file grew by over the tokens the turns added; beside it, the same turns
and events as schema 1 stored them (every prompt whole, as JSON).

The conversation is a coding agent's: a system prompt and a task, then per turn a completion
(a sentence and a ``bash`` tool call, logprobs as vLLM gives them: fp32 values) and the tool's
output, a slice of rollyard's own source (``TOOL_CHARS`` characters). New tokens per turn: the
prompt ids past the previous turn's prompt + completion, plus the completion's ids.

Bytes: the database after a ``TRUNCATE`` checkpoint (the WAL copied in and emptied; while it
runs the WAL holds at most ~``CHECKPOINT_BYTES`` of rows more), less the same journal's size
before the conversation (its tables' first pages and the program's row: ~40 KB per journal,
once). The issue-38 bound, checked by ``within_bound``: bytes <= 1.2 x 8 B x new tokens +
``FIXED_BYTES_PER_TURN`` x turns (8 B: an int32 id and a float32 logprob; the fixed part is
the turn's metadata JSON, its events, the conversation and program rows' rewrites and SQLite's
per-row and per-page costs).
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import tempfile
import time
from array import array
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import rollyard
from rollyard.core.program import Program
from rollyard.core.trajectory import FinishReason, Trajectory
from rollyard.engines.base import Completion
from rollyard.gateway.divided import Generated
from rollyard.gateway.journal_schema import SCHEMA_V1
from rollyard.gateway.recorder import SqliteJournal
from rollyard.gateway.renderer import ConversationState, Renderer
from rollyard.gateway.sampling import sampling_for
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.gateway.turn_record import build_turn
from rollyard.gateway.types import ChatRequest, Message, Tool
from rollyard.sched import Start

TOOL_CHARS = 2400
FIXED_BYTES_PER_TURN = 1024
BYTES_PER_NEW_TOKEN = 8 * 1.2
BASH = Tool("bash", "Run a shell command in the sandbox.", {"type": "object", "properties": {"command": {}}})


def _sources() -> Iterator[tuple[str, str]]:
    root = Path(rollyard.__file__).parent
    while True:
        for p in sorted(root.rglob("*.py")):
            yield str(p.relative_to(root)), p.read_text()


async def conversation(
    journal: SqliteJournal, renderer: Renderer, turns: int, tool_chars: int = TOOL_CHARS, seed: int = 0
) -> AsyncIterator[tuple[Program, int]]:
    """Record ``turns`` turns of one program; yields the program and each turn's new tokens."""
    rng = random.Random(seed)
    program = Program()
    journal.save_program(program)
    messages = [Message("system", "You are a coding agent."), Message("user", "Fix the failing test.")]
    state: ConversationState | None = None
    files = _sources()
    for _ in range(turns):
        request = ChatRequest(messages=list(messages), tools=[BASH])
        plan = renderer.render(request, state, in_place=True)
        params = sampling_for(request, program, len(plan.prompt_ids), 1 << 20)
        name, text = next(files)
        call = f'{{"name": "bash", "arguments": {{"command": "cat {name}"}}}}'
        ids = [
            *renderer.tok.encode(f"Let me read {name}.\n<tool_call>{call}</tool_call>"),
            renderer.tok.eos_id,
        ]
        lps = array("f", [-rng.expovariate(4.0) for _ in ids]).tolist()  # fp32 values, as vLLM's
        completion = Completion(token_ids=ids, logprobs=lps, finish_reason=FinishReason.STOP, prompt_tokens=0)
        now = time.time()
        gen = Generated(completion, Start("", program.id, "engine0"), now, 0.0)
        rec = build_turn(renderer, request, plan, params, gen, state, now, now, "tiny")
        await journal.record_turn(program, rec.turn, rec.segment, rec.events, rec.state)
        yield program, len(plan.prompt_ids) - plan.reused_tokens + len(ids)
        state = rec.state
        call_id = rec.result.message.tool_calls[0].id
        messages += [rec.result.message, Message("tool", text[:tool_chars], tool_call_id=call_id)]


def _size(db: sqlite3.Connection, path: Path) -> int:
    db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))


def _v1_bytes(path: Path, traj: Trajectory) -> int:
    """What schema 1 stored for the same program: its row, each turn whole, its events."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA_V1)
    program = Program.model_validate(traj.metadata["program"])
    db.execute("INSERT INTO programs (id, body) VALUES (?, ?)", (program.id, program.model_dump_json()))
    before = _size(db, path)
    for seg, s in enumerate(traj.segments):
        for t in s.turns:
            row = (program.id, t.index, seg, t.model_dump_json())
            db.execute("INSERT INTO turns (program_id, idx, segment, body) VALUES (?, ?, ?, ?)", row)
    for e in traj.events:
        db.execute("INSERT INTO events (program_id, body) VALUES (?, ?)", (program.id, e.model_dump_json()))
    grown = _size(db, path) - before
    db.close()
    return grown


def journal_bytes_per_new_token(
    model_dir: Path, turns: int = 32, tool_chars: int = TOOL_CHARS
) -> dict[str, Any]:
    """``journal_bytes_per_new_token`` and its parts for one ``turns``-turn conversation."""
    renderer = Renderer(FastTokenizer(model_dir))
    with tempfile.TemporaryDirectory(prefix="rollyard-journal-size-") as d:
        path = Path(d) / "journal.db"
        journal = SqliteJournal(path)
        try:
            before = _size(journal._db, path)

            async def run() -> tuple[int, Trajectory]:
                sizes = [(p, n) async for p, n in conversation(journal, renderer, turns, tool_chars)]
                return sum(n for _, n in sizes), await journal.atrajectory(sizes[0][0].id)

            new_tokens, traj = asyncio.run(run())
            grown = _size(journal._db, path) - before
        finally:
            journal.close()
        v1 = _v1_bytes(Path(d) / "v1.db", traj)
    fixed = (grown - BYTES_PER_NEW_TOKEN * new_tokens) / turns
    return {
        "journal_bytes_per_new_token": grown / new_tokens,
        "journal_bytes_per_new_token_v1": v1 / new_tokens,  # the same turns, as schema 1 kept them
        "journal_bytes": grown,
        "new_tokens": new_tokens,
        "context_tokens": traj.turns[-1].total_tokens,
        "turns": turns,
        "fixed_bytes_per_turn": fixed,  # bytes per turn beyond 1.2 x 8 B x its new tokens
        "within_bound": fixed <= FIXED_BYTES_PER_TURN,
    }


def main() -> None:
    """``python -m rollyard.bench._journal_size [MODEL_DIR]``: the figures for the tiny model
    (created in a temporary directory when no model dir is given)."""
    import sys

    from rollyard.engines.tiny_model import create_model

    with tempfile.TemporaryDirectory() as d:
        model_dir = (
            Path(sys.argv[1]) if len(sys.argv) > 1 else create_model(Path(d) / "tiny", seed=0, size="tiny")
        )
        for turns in (8, 32, 64):
            r = journal_bytes_per_new_token(model_dir, turns=turns)
            print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))


if __name__ == "__main__":
    main()
