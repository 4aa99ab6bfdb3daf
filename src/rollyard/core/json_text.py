"""JSON text a client or a model wrote (tool-call arguments): read it, or say it cannot be read.

``json.loads`` refuses text nested deeper than it reads with a ``RecursionError``, not a
``ValueError``: a 100 KB ``"[" * 100_000`` is one, and every reader of such text must treat it as
it treats any other text that is not JSON."""

from __future__ import annotations

import json
from typing import Any, Final

UNREADABLE: Final = object()


def read_json(text: str) -> Any:
    """``json.loads(text)``, or ``UNREADABLE`` where the text is not JSON or is nested too deep."""
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return UNREADABLE
