"""Giving the C heap's free pages back to the system (glibc's ``malloc_trim``; a no-op elsewhere).

Why: glibc keeps freed memory for the process. A buffer freed below its mmap threshold stays in
the heap, and once a large buffer has been freed that threshold rises (up to 32 MiB), so most of a
training step's tensors then come from the heap too. What one step freed is reused only where the
next step's sizes happen to fit, so a trainer's resident memory kept growing well past one step's
peak: the CLI-learning demo (``configs/demo-mini-swe-agent.yaml``, ~2k-token samples) reached
15-17 GB on a 24 GB machine and was killed by the OOM killer during its final evaluation, with
~5 GB in use at any time (measured with glibc's mmap threshold pinned, 2026-12-06). A trim once a
step returns every whole free page, in the middle of the heap too; the next step faults in what it
needs again (once a step, not once per tensor as a pinned threshold costs: that run's SFT steps
took ~28 s against ~20 s). With the trim the same demo peaked at 5.0 GB.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools

__all__ = ["libc", "release_free_heap"]


@functools.cache
def libc() -> ctypes.CDLL | None:
    """The process's C library, looked up once (``find_library`` runs ``ldconfig``)."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def release_free_heap() -> bool:
    """Hand the C heap's free pages back to the system; False where the C library has no
    ``malloc_trim`` (musl, macOS) or nothing was given back."""
    with contextlib.suppress(AttributeError):
        if (c := libc()) is not None:
            return bool(c.malloc_trim(0))
    return False
