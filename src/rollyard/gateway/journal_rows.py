"""How a turn is stored: its new tokens only, ids and logprobs as packed binary.

Within a segment a turn's prompt is the previous turn's prompt and completion followed by
what is new (an eos that closes the previous completion, the new messages, the generation
prompt), so a row holds ``reused`` (how many leading prompt ids are the previous turn's prompt
+ completion) and the tail after them; ``rebuild`` puts full prompts back on read. A turn that
starts a segment has ``reused`` 0 and its whole prompt as the tail. Bytes per turn are then
linear in the turn's new tokens, where storing every prompt whole made a conversation's journal
quadratic in its length.

Packing: ids as uint16 when every id fits (vocabularies up to 65,536), else int32, else int64;
logprobs as float32 when that is exact (vLLM computes them in fp32), else float64. The first
byte of a blob names its type, so every value reads back exactly as it was given. Both take
time linear in the new tokens only, on the event loop (see ``recorder``'s docstring).

Reading: ``trajectory_rows`` reads a program's rows in one transaction, ``trajectory_of``
makes its trajectory of them.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import zlib
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pydantic_core

from rollyard.core.errors import DataError, NotFound
from rollyard.core.events import Event
from rollyard.core.program import Program
from rollyard.core.trajectory import Outcome, Segment, Trajectory, Turn

_BIG_ENDIAN = sys.byteorder == "big"  # blobs are little-endian whatever the machine
_ID_CODES = "Hiq"
_LOGPROB_CODES = "fd"
# A message's JSON longer than this is stored zlib-compressed (a BLOB; shorter ones as TEXT):
# tool outputs are most of a conversation's text, and code and logs compress ~3x (level 1:
# ~20 us for a 2.4 KB tool output). The text stays in the events and the turn ids regardless.
COMPRESS_MESSAGE_BYTES = 512
# The fields a row keeps outside its meta JSON.
PACKED = frozenset({"prompt_ids", "completion_ids", "completion_logprobs"})


def _pack(a: array[Any]) -> bytes:
    if _BIG_ENDIAN:
        a.byteswap()
    return a.typecode.encode() + a.tobytes()


def pack_ids(ids: list[int]) -> bytes:
    for code in _ID_CODES:
        try:
            return _pack(array(code, ids))
        except OverflowError:
            continue
    raise DataError("a token id does not fit 64 bits")


def pack_logprobs(lps: list[float]) -> bytes:
    narrow = array("f", lps)
    return _pack(narrow if narrow.tolist() == lps else array("d", lps))


def unpack(blob: bytes) -> list[Any]:
    code = chr(blob[0])
    if code not in _ID_CODES and code not in _LOGPROB_CODES:
        raise DataError(f"journal blob of unknown type {code!r}")
    a = array(code)
    a.frombytes(blob[1:])
    if _BIG_ENDIAN:
        a.byteswap()
    return a.tolist()


def pack_message(m: dict[str, Any]) -> str | bytes:
    text = pydantic_core.to_json(m)
    return zlib.compress(text, 1) if len(text) > COMPRESS_MESSAGE_BYTES else text.decode()


def unpack_message(body: str | bytes) -> dict[str, Any]:
    return json.loads(zlib.decompress(body) if isinstance(body, bytes) else body)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class LastTurn:
    """What the next turn of a program needs from its previous one, O(1) in its length: the
    previous turn's index and segment, its prompt + completion length, and the ids at the
    seams, checked before a prompt is stored as an extension of it."""

    index: int
    segment: int
    end: int  # len(prompt) + len(completion)
    seams: tuple[tuple[int, int], ...]  # (position, id): last prompt id, first and last completion id

    @classmethod
    def of(cls, turn: Turn, segment: int) -> LastTurn:
        p = turn.prompt_ids
        return cls.of_parts(turn.index, segment, len(p), p[-1], turn.completion_ids)

    @classmethod
    def of_parts(
        cls, index: int, segment: int, prompt_len: int, last_prompt_id: int | None, completion: list[int]
    ) -> LastTurn:
        c = completion
        seams = [] if last_prompt_id is None else [(prompt_len - 1, last_prompt_id)]
        if c:
            seams += [(prompt_len, c[0]), (prompt_len + len(c) - 1, c[-1])]
        return cls(index, segment, prompt_len + len(c), tuple(seams))

    @classmethod
    def of_row(cls, row: tuple[Any, ...]) -> LastTurn:
        """From a row of ``TURN_COLUMNS`` alone (O(its new tokens))."""
        idx, seg, _, prompt_len, tail, c_blob = row[:6]
        ids = unpack(tail)
        return cls.of_parts(idx, seg, prompt_len, ids[-1] if ids else None, unpack(c_blob))

    def reused_by(self, turn: Turn, segment: int) -> int:
        """How many leading ids of ``turn``'s prompt to store as this turn's (0: none)."""
        p = turn.prompt_ids
        if segment != self.segment or turn.index != self.index + 1 or len(p) < self.end:
            return 0
        return self.end if all(p[i] == v for i, v in self.seams) else 0


def turn_row(program_id: str, turn: Turn, segment: int, reused: int) -> tuple[Any, ...]:
    """The ``turns`` row of ``turn`` (see ``INSERT_TURN``)."""
    meta = turn.model_dump_json(exclude=PACKED)
    return (
        program_id,
        turn.index,
        segment,
        reused,
        len(turn.prompt_ids),
        pack_ids(turn.prompt_ids[reused:]),
        pack_ids(turn.completion_ids),
        pack_logprobs(turn.completion_logprobs),
        meta,
    )


INSERT_TURN = (
    "INSERT INTO turns (program_id, idx, segment, reused, prompt_len, prompt_tail, completion_ids, "
    "completion_logprobs, meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
)
TURN_COLUMNS = "idx, segment, reused, prompt_len, prompt_tail, completion_ids, completion_logprobs, meta"


def rebuild(program_id: str, rows: Iterable[tuple[Any, ...]]) -> list[tuple[int, Turn, bool]]:
    """All of ``iter_rebuild``."""
    return list(iter_rebuild(program_id, rows))


def iter_rebuild(program_id: str, rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[int, Turn, bool]]:
    """``(segment, turn, extends)`` per row (rows of ``TURN_COLUMNS`` in index order), full
    prompts put back; ``extends``: stored as its predecessor's prompt + completion + a tail, so
    it extends it by construction. A row that claims more of its predecessor than there is is
    a ``DataError``.

    Each turn is validated on its new parts only (the tail, the completion, the metadata), then
    given its full prompt: the prefix's ids were checked in the rows before, and validating
    every prompt whole made reading a 30k-token trajectory several times slower."""
    prev: tuple[int, int, list[int], list[int]] | None = None  # segment, index, prompt, completion
    for idx, seg, reused, prompt_len, tail_blob, c_blob, lp_blob, meta in rows:
        tail = unpack(tail_blob)
        extends = False
        if reused:
            if prev is None or prev[0] != seg or prev[1] != idx - 1 or reused > len(prev[2]) + len(prev[3]):
                raise DataError(
                    f"journal: turn {idx} of program {program_id} extends a turn the journal does not hold"
                )
            p, c = prev[2], prev[3]
            extends = reused == len(p) + len(c)
            prompt = p[:reused] if reused <= len(p) else p + c[: reused - len(p)]
            prompt += tail
        else:
            prompt = tail
        if len(prompt) != prompt_len or not prompt:
            raise DataError(f"journal: turn {idx} of program {program_id} rebuilds to a wrong length")
        fields = json.loads(meta)
        completion = unpack(c_blob)
        fields.update(
            prompt_ids=tail or prompt[-1:], completion_ids=completion, completion_logprobs=unpack(lp_blob)
        )
        turn = Turn.model_validate(fields).model_copy(update={"prompt_ids": prompt})
        yield seg, turn, extends
        prev = (seg, idx, prompt, completion)


Rows = tuple[tuple[str, str | None] | None, list[tuple[Any, ...]], list[tuple[str]]]


def trajectory_rows(db: sqlite3.Connection, program_id: str) -> Rows:
    """A program's row, turn rows and event rows, read in one transaction (a consistent view)."""
    db.execute("BEGIN")
    try:
        prow = db.execute("SELECT body, outcome FROM programs WHERE id = ?", (program_id,)).fetchone()
        turns = db.execute(
            f"SELECT {TURN_COLUMNS} FROM turns WHERE program_id = ? ORDER BY idx", (program_id,)
        ).fetchall()
        events = db.execute(
            "SELECT body FROM events WHERE program_id = ? ORDER BY seq", (program_id,)
        ).fetchall()
    finally:
        db.execute("COMMIT")
    return prow, turns, events


def trajectory_of(
    program_id: str,
    prow: tuple[str, str | None] | None,
    turns: list[tuple[Any, ...]],
    events: list[tuple[str]],
    rebuilt: list[tuple[int, Turn, bool]] | None = None,
) -> Trajectory:
    """The trajectory of the rows (``rebuilt``: their turns, if rebuilt already)."""
    if prow is None:
        raise NotFound(f"no program {program_id!r}")
    program = Program.model_validate_json(prow[0])
    segments: list[Segment] = []
    run: list[Turn] = []
    checked = True  # every turn of ``run`` after its first extends it by construction
    for i, (seg, turn, extends) in enumerate(rebuilt if rebuilt is not None else rebuild(program_id, turns)):
        run.append(turn)
        checked = checked and (extends or len(run) == 1)
        if i + 1 == len(turns) or turns[i + 1][1] != seg:  # the segment ends here
            # a segment of constructed extensions needs no O(context) prefix comparisons
            segments.append(Segment.model_construct(turns=run) if checked else Segment(turns=run))
            run, checked = [], True
    # Built without validation: every part was validated above, and pydantic would run each
    # segment's prefix check again (an after-validator runs on instances too).
    return Trajectory.model_construct(
        id=f"traj_{program.id.removeprefix('prog_')}",
        program_id=program.id,
        group_id=program.group_id,
        task_id=program.task_id,
        segments=segments,
        events=[Event.model_validate_json(e[0]) for e in events],
        outcome=Outcome.model_validate_json(prow[1]) if prow[1] else None,
        metadata={"program": program.public()},
    )
