"""Identifiers and secrets."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    """A short, collision-safe id such as ``prog_3f9a...`` (64 random bits)."""
    return f"{prefix}_{secrets.token_hex(8)}"


def wire_id(prefix: str) -> str:
    """An id in the style the APIs use (``chatcmpl-``, ``resp_``, ``call_`` + 24 hex digits, 96
    random bits). ``secrets.token_hex``: a quarter of ``uuid4``'s cost, and several are minted
    on the gateway's event loop for every model call."""
    return prefix + secrets.token_hex(12)


def new_key(prefix: str = "ry") -> str:
    """An API key with 192 bits of entropy; never logged."""
    return f"{prefix}-{secrets.token_urlsafe(24)}"


def keys_equal(a: str, b: str) -> bool:
    """Constant-time comparison, so key checks leak no timing."""
    return secrets.compare_digest(a.encode(), b.encode())
