"""Where rollyard keeps what it fetched once (wheels, converted models, installed agent CLIs)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["cache_dir"]


def cache_dir() -> Path:
    """``ROLLYARD_CACHE``, else ``$XDG_CACHE_HOME/rollyard`` (``~/.cache/rollyard``)."""
    root = os.environ.get("ROLLYARD_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "rollyard"
    )
    return Path(root)
