"""The gateway process's C heap settings: a long conversation's buffers are reused, not mapped
and faulted in afresh each turn, and memory still goes back past the thresholds (``gateway.heap``)."""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import os
import subprocess
import sys

import pytest

from rollyard.gateway.heap import MMAP_THRESHOLD, TRIM_THRESHOLD

# In a fresh interpreter (mallopt's settings are process-wide): buffers of the given sizes are
# held, then freed; glibc's own counters say whether they were mappings of their own (hblks),
# how far the heap grew for them (arena) and how much of that it kept once they were freed.
# "plain" sets glibc's documented defaults explicitly (128 KiB each), so the result does not
# hang on the dynamic threshold's state at start-up or on MALLOC_*_ variables.
_PROBE = """
import ctypes, ctypes.util, json, sys
from rollyard.gateway.heap import tune_heap

class Info(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]

libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.mallinfo2.restype = Info
if sys.argv[1] == "tuned":
    tuned = tune_heap(freeze=False)
else:
    tuned = libc.mallopt(-3, 128 << 10) == 1 and libc.mallopt(-1, 128 << 10) == 1
sizes = json.loads(sys.argv[2])
before = libc.mallinfo2()
bufs = [bytearray(n) for n in sizes]
held = libc.mallinfo2()
del bufs
after = libc.mallinfo2()
print(json.dumps({"tuned": tuned, "mapped": held.hblks - before.hblks,
                  "heap_grew": held.arena - before.arena, "kept": after.arena - before.arena}))
"""


def _probe(mode: str, sizes: list[int]) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode, json.dumps(sizes)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def _glibc() -> bool:
    if os.environ.get("LD_PRELOAD"):  # another allocator answers malloc; glibc's counters say nothing
        return False
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c")), "mallinfo2")
    except OSError:
        return False


pytestmark = pytest.mark.skipif(
    not _glibc(), reason="the thresholds are glibc's (mallinfo2: glibc >= 2.33, no preloaded allocator)"
)

BUFFER = 2 << 20  # a long prompt's buffers are a few hundred KB; well under the mmap threshold


def test_large_buffers_come_from_the_heap_and_stay_there_once_tuned() -> None:
    plain, tuned = _probe("plain", [BUFFER]), _probe("tuned", [BUFFER])
    # glibc's defaults: a mapping of its own, unmapped when freed
    assert plain["tuned"] is True, plain
    assert plain["mapped"] == 1 and plain["heap_grew"] == 0, plain
    # tuned: from the heap, whose top is kept for the next turn's buffers
    assert tuned["tuned"] is True, tuned
    assert tuned["mapped"] == 0 and tuned["heap_grew"] > 0, tuned
    assert tuned["kept"] == tuned["heap_grew"], tuned  # not trimmed when the buffer was freed


def test_memory_still_goes_back_past_the_thresholds_once_tuned() -> None:
    # a buffer at the mmap threshold is its own mapping (given back when freed)
    huge = _probe("tuned", [MMAP_THRESHOLD])
    assert huge["mapped"] == 1 and huge["heap_grew"] == 0, huge
    # more than the trim threshold freed at the heap's top: the top is given back
    many = _probe("tuned", [BUFFER] * (TRIM_THRESHOLD // BUFFER + 4))
    assert many["mapped"] == 0 and many["heap_grew"] > TRIM_THRESHOLD, many
    assert many["kept"] < many["heap_grew"] - TRIM_THRESHOLD // 2, many
