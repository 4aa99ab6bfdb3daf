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
above glibc's initial mmap threshold (128 KB). glibc raises that threshold to the size of a
mapped buffer once one is freed, and its trim threshold to twice that, so with many turns in
flight their freed buffers (64 programs at 30k ids: ~15 MB of id lists alone) exceed the trim
threshold, the heap's top is given back, and the next turns fault and zero those pages afresh:
a cost in proportion to the history, on the event loop. Copying a 30k-id prompt
(``PromptIds(prompt[:])``, fresh interpreter, min over 25 rounds, us per copy): one in flight,
~204 with the defaults against ~55 tuned; 64 in flight, 149-298 against 58-61 with the values
below, 108-117 with an 8 MiB trim threshold. So: buffers under ``MMAP_THRESHOLD`` (4 MiB) come
from the heap, and up to ``TRIM_THRESHOLD`` (16 MiB) free at the top of each arena is kept for
the next turns. What goes back to the system, and when: a buffer of 4 MiB or more is its own
mapping, unmapped when freed; the heap's top is given back by ``free`` once more than 16 MiB of
it is free; everything free (the middle of the heap too) goes back when the connection guard
calls ``malloc_trim``: after a surge of connections has closed, and once no connection has been
open for 30 s (``conn_guard.Census``). Free memory below 16 MiB at the top, and free holes
inside the heap, stay with the process until then.
"""

from __future__ import annotations

import gc
import logging

from rollyard.core.heap import libc

log = logging.getLogger(__name__)

GEN0_THRESHOLD = 50_000
# glibc's mallopt parameters, and the values set: allocations under 4 MiB come from the heap;
# up to 16 MiB free at an arena's top is kept (an 8 MiB one lost about half the gain with 64
# turns in flight, see above; 32/64 MiB kept no more of it)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
MMAP_THRESHOLD = 4 << 20
TRIM_THRESHOLD = 16 << 20


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
    mallopt = getattr(libc(), "mallopt", None)
    if mallopt is None:  # no C library found, or not glibc (musl, macOS): its own policy stays
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    if not ok:
        log.warning("mallopt refused the gateway's heap thresholds; glibc's defaults stay")
    return ok
