"""The gateway process's heap settings: fewer, cheaper collections; large buffers reused.

Why: CPython's cyclic collector runs a young-generation pass every 700 net container
allocations. A gateway with tens to hundreds of requests in flight holds thousands of young
containers (bodies, messages, id lists, response dicts) at any time, so nearly every pass walks
all of them and promotes them; the promoted ones then feed full collections that walk the whole
heap (FastAPI, pydantic schemas, the tokenizer, every program's state). Measured in-process
(scripted engine, 64 concurrent chat requests, 12,000 requests): the default thresholds spent
~3.1 s of CPU in 2,634 collections (~0.26 ms a request, ~17-20% of the gateway's CPU), with
full collections up to ~110 ms that stall the event loop (``/health`` and every stream wait);
with a first-generation threshold of 50,000 no collection ran in the same run. Reference
counting still frees everything that is not part of a cycle at once; cyclic garbage waits for
the next pass (a bounded amount: ``GEN0_THRESHOLD`` container allocations).

``gc.freeze()`` (a dedicated gateway process only) moves what start-up created (modules, the
app, the tokenizer, the loaded journal state) to the permanent generation, which collections
never walk again.

C heap (glibc only, a dedicated gateway process only): a turn of a long conversation handles
buffers of 100-250 KB (the request body, the prompt's id list and its JSON, the engine's answer),
above glibc's initial mmap threshold (128 KB) and its default trim threshold. Each such buffer
was mapped and unmapped, or the heap's top given back and taken again, so its pages were
faulted in and zeroed afresh every turn: a cost in proportion to the history, on the event loop
(a copy of a 30k-id list measured 711 us against 73 us with the settings below). With
``MMAP_THRESHOLD`` and ``TRIM_THRESHOLD`` raised, freed buffers are reused from the heap. Memory
still goes back: the connection guard calls ``malloc_trim`` once a surge of connections has
closed (``conn_guard``), which ignores the trim threshold.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 50_000
# glibc's mallopt parameters, and the values set: allocations under 32 MiB (glibc's own ceiling
# for its dynamic threshold) come from the heap; up to 64 MiB free at its top is kept
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 64 << 20


def tune_heap(*, freeze: bool) -> bool:
    """Raise the young-generation threshold and glibc's mmap and trim thresholds (the latter
    False where the C library is not glibc); with ``freeze``, exempt what exists now from later
    collections (call it once start-up is done, in a process that is the gateway)."""
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gen0), gen1, gen2)
    if freeze:
        gc.collect()  # start-up's own garbage goes now, not into the permanent generation
        gc.freeze()
    return _tune_malloc()


def _tune_malloc() -> bool:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc (musl, macOS): its own policy stays
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("mallopt refused the gateway's heap thresholds; glibc's defaults stay")
    return ok
