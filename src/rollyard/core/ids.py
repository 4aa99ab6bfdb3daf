"""Identifiers and secrets."""

from __future__ import annotations

import secrets
import uuid


def new_id(prefix: str) -> str:
    """A short, sortable-enough, collision-safe id such as ``prog_3f9a...``."""
    return f"{prefix}_{uuid.uuid4().hex[:16]}"


def new_key(prefix: str = "ry") -> str:
    """An API key with 192 bits of entropy; never logged."""
    return f"{prefix}-{secrets.token_urlsafe(24)}"


def keys_equal(a: str, b: str) -> bool:
    """Constant-time comparison, so key checks leak no timing."""
    return secrets.compare_digest(a.encode(), b.encode())
