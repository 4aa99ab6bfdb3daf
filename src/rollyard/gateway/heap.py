"""The gateway process's garbage-collector settings: fewer, cheaper collections.

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
"""

from __future__ import annotations

import gc

GEN0_THRESHOLD = 50_000


def tune_gc(*, freeze: bool) -> None:
    """Raise the young-generation threshold; with ``freeze``, exempt what exists now from
    later collections (call it once start-up is done, in a process that is the gateway)."""
    gen0, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(max(GEN0_THRESHOLD, gen0), gen1, gen2)
    if freeze:
        gc.collect()  # start-up's own garbage goes now, not into the permanent generation
        gc.freeze()
