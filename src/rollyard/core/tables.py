"""Trajectories to and from Parquet (pyarrow) and JSONL.

Parquet rows are trajectories; turns are a nested list column with typed id and logprob
lists, so a reader (verl, slime, HF datasets) gets token ids without parsing JSON. Free-form
dicts (events' data, metadata, sampling) are stored as JSON strings. Files are written to a
temporary name and renamed, so a reader never sees half a file.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from rollyard.core.errors import DataError
from rollyard.core.trajectory import SCHEMA_VERSION, Trajectory

_TURN = pa.struct(
    [
        ("index", pa.int32()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_logprobs", pa.list_(pa.float32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("policy_version", pa.int64()),
        ("finish_reason", pa.string()),
        ("timings", pa.string()),
        ("engine", pa.string()),
        ("sampling", pa.string()),
        ("requested_sampling", pa.string()),
        ("flags", pa.list_(pa.string())),
        ("forced", pa.list_(pa.list_(pa.int32()))),
    ]
)

SCHEMA = pa.schema(
    [
        ("schema_version", pa.int32()),
        ("id", pa.string()),
        ("program_id", pa.string()),
        ("group_id", pa.string()),
        ("task_id", pa.string()),
        ("segments", pa.list_(pa.list_(_TURN))),
        ("events", pa.string()),
        ("outcome", pa.string()),
        ("reward", pa.float64()),
        ("metadata", pa.string()),
    ],
    metadata={"rollyard_schema_version": str(SCHEMA_VERSION)},
)


def _row(t: Trajectory) -> dict[str, Any]:
    d = t.model_dump(mode="json")
    segments = []
    for seg in d["segments"]:
        turns = []
        for turn in seg["turns"]:
            turn = dict(turn)
            for key in ("timings", "sampling", "requested_sampling"):
                turn[key] = json.dumps(turn[key], sort_keys=True)
            turns.append(turn)
        segments.append(turns)
    return {
        "schema_version": d["schema_version"],
        "id": d["id"],
        "program_id": d["program_id"],
        "group_id": d["group_id"],
        "task_id": d["task_id"],
        "segments": segments,
        "events": json.dumps(d["events"]),
        "outcome": json.dumps(d["outcome"]),
        "reward": t.outcome.reward if t.outcome else None,
        "metadata": json.dumps(d["metadata"], sort_keys=True),
    }


def to_table(trajectories: Iterable[Trajectory]) -> pa.Table:
    return pa.Table.from_pylist([_row(t) for t in trajectories], schema=SCHEMA)


def from_table(table: pa.Table) -> list[Trajectory]:
    missing = set(SCHEMA.names) - set(table.column_names)
    if missing:
        raise DataError(f"not a rollyard trajectory table: missing columns {sorted(missing)}")
    out = []
    for row in table.to_pylist():
        segments = []
        for turns in row["segments"] or []:
            parsed = []
            for turn in turns:
                turn = dict(turn)
                for key in ("timings", "sampling", "requested_sampling"):
                    turn[key] = json.loads(turn[key]) if turn[key] else {}
                turn["forced"] = turn.get("forced") or []  # files written before forced runs
                parsed.append(turn)
            segments.append({"turns": parsed})
        try:
            out.append(
                Trajectory.model_validate(
                    {
                        "schema_version": row["schema_version"],
                        "id": row["id"],
                        "program_id": row["program_id"],
                        "group_id": row["group_id"],
                        "task_id": row["task_id"],
                        "segments": segments,
                        "events": json.loads(row["events"] or "[]"),
                        "outcome": json.loads(row["outcome"] or "null"),
                        "metadata": json.loads(row["metadata"] or "{}"),
                    }
                )
            )
        except ValueError as e:
            raise DataError(f"trajectory {row.get('id')!r} is invalid: {e}") from e
    return out


def _atomic_write(path: Path, write: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_parquet(path: str | Path, trajectories: Iterable[Trajectory]) -> Path:
    path = Path(path)
    table = to_table(trajectories)
    _atomic_write(path, lambda tmp: pq.write_table(table, tmp))
    return path


def read_parquet(path: str | Path) -> list[Trajectory]:
    try:
        table = pq.read_table(path)
    except (OSError, pa.ArrowInvalid) as e:
        raise DataError(f"cannot read trajectories from {path}: {e}") from e
    return from_table(table)


def write_jsonl(path: str | Path, trajectories: Iterable[Trajectory]) -> Path:
    path = Path(path)

    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            for t in trajectories:
                f.write(t.model_dump_json())
                f.write("\n")

    _atomic_write(path, write)
    return path


def read_jsonl(path: str | Path) -> list[Trajectory]:
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Trajectory.model_validate_json(line))
            except ValueError as e:
                raise DataError(f"{path}:{n}: invalid trajectory: {e}") from e
    return out
