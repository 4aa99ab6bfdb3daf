"""The gateway process's C heap settings: a long conversation's buffers are reused, not mapped
and faulted in afresh each turn (``gateway.heap``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import subprocess
import sys

import pytest

# In a fresh interpreter (mallopt's settings are process-wide): an 8 MiB buffer, as a long
# prompt's engine body is a few hundred KB, is held, then freed; glibc's own counters say
# whether it was a mapping of its own (hblks) and whether the heap gave its pages back (arena).
_PROBE = """
import ctypes, ctypes.util, json, sys
from rollyard.gateway.heap import tune_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Info
tuned = tune_heap(freeze=False) if sys.argv[1] == "tuned" else None
before = libc.mallinfo2()
buf = bytearray(8 << 20)
held = libc.mallinfo2()
del buf
after = libc.mallinfo2()
print(json.dumps({"tuned": tuned, "mapped": held.hblks - before.hblks,
                  "heap_grew": held.arena - before.arena, "kept": after.arena - before.arena}))
"""


def _probe(mode: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, timeout=60
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc(), reason="the thresholds are glibc's (mallinfo2: glibc >= 2.33)")
def test_large_buffers_come_from_the_heap_and_stay_there_once_tuned() -> None:
    plain, tuned = _probe("plain"), _probe("tuned")
    # glibc's defaults: a mapping of its own, unmapped when freed
    assert plain["mapped"] == 1 and plain["heap_grew"] == 0, plain
    # tuned: from the heap, whose top is kept for the next turn's buffers
    assert tuned["tuned"] is True, tuned
    assert tuned["mapped"] == 0 and tuned["heap_grew"] > 0, tuned
    assert tuned["kept"] == tuned["heap_grew"], tuned  # not trimmed when the buffer was freed
