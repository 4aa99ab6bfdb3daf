"""One choice of a vLLM completion, streamed or not, read into what a turn records: token ids,
finite logprobs, the alternatives asked for, the finish reason."""

from __future__ import annotations

import math
from typing import Any

import pydantic_core

from rollyard.core.errors import EngineError
from rollyard.core.trajectory import FinishReason

__all__ = [
    "check_count",
    "finish",
    "ids_of_tokens",
    "loads",
    "logprob_values",
    "token_ids",
    "token_logprobs",
    "top_logprobs",
    "top_of_rows",
]


_PROMPT_ECHO = b'"prompt_token_ids":'


def without_prompt_echo(raw: bytes) -> bytes:
    """``raw`` with the engine's echo of the prompt ids (``return_token_ids`` sends them back
    with the completion's) replaced by ``null``, before it is parsed.

    The gateway knows the prompt it sent; parsing a 30k-token echo cost ~0.8 ms a turn, the
    largest part of a long conversation's turn that grew with its history. Safe to find by
    bytes: inside a JSON string every quote is escaped, so the key with its closing quote
    occurs only as a key, and its value is a flat list of integers (no bracket before its end).
    """
    start = raw.find(_PROMPT_ECHO)
    if start < 0:
        return raw
    at = start + len(_PROMPT_ECHO)
    while raw[at : at + 1] in (b" ", b"\n"):
        at += 1
    if raw[at : at + 1] != b"[":
        return raw
    end = raw.find(b"]", at)
    return raw if end < 0 else raw[:start] + _PROMPT_ECHO + b"null" + raw[end + 1 :]


def loads(text: str | bytes) -> Any:
    """The engine's JSON, parsed by pydantic-core (~3x ``json.loads`` on a completion with
    logprobs); ``-Infinity`` logprobs are accepted as vLLM writes them. The prompt's echo is
    not read (``without_prompt_echo``)."""
    if isinstance(text, bytes):
        text = without_prompt_echo(text)
    return pydantic_core.from_json(text, allow_inf_nan=True)


def finish(reason: str | None) -> FinishReason:
    if reason == "length":
        return FinishReason.LENGTH
    if reason in ("stop", None):
        return FinishReason.STOP
    return FinishReason.ABORT


AS_ID = "token_id:"


def token_ids(choice: dict[str, Any]) -> list[int]:
    """The completion's ids: ``token_ids`` (``return_token_ids``), else its logprobs' tokens as
    ``return_tokens_as_token_ids`` writes them, ``"token_id:N"`` with N in ASCII digits
    (``EngineError`` for any other).

    A choice with neither is ``EngineError``: the gateway asks for one of them on every request,
    so their absence is a broken answer, not an empty turn (vLLM sends a logprobs object, with
    empty lists, even for a streamed event that holds no token)."""
    ids = choice.get("token_ids")
    if ids is not None:
        return [int(t) for t in ids]
    logprobs = choice.get("logprobs")
    if logprobs is None:
        shown = str(choice)[:200]
        raise EngineError(f"engine answered a choice with neither token_ids nor logprobs: {shown}")
    return ids_of_tokens(logprobs.get("tokens") or [])


def ids_of_tokens(tokens: list[str]) -> list[int]:
    """The ids of logprobs' tokens as ``return_tokens_as_token_ids`` writes them, ``"token_id:N"``
    with N in ASCII digits (``EngineError`` for any other)."""
    if not tokens:
        return []
    if len(tokens) == 1:  # a streamed event's one token: the same checks, without the joins
        digits = tokens[0][len(AS_ID) :] if tokens[0].startswith(AS_ID) else ""
        if not (digits.isascii() and digits.isdigit()):
            raise EngineError(f"engine's logprobs tokens are not token ids: {tokens[:3]}")
        return [int(digits)]
    # in C, not a call per token: each token starts with the prefix and holds it once, what is
    # left of them is ASCII digits only (``int`` alone would take " 5", "5_0", "+5" or other
    # scripts' digits, none of which vLLM writes), and those are the ids
    text = ",".join(tokens)
    n = len(tokens)
    starts = text.startswith(AS_ID) and text.count("," + AS_ID) == n - 1
    rest = text.replace(AS_ID, "")
    digits = rest.replace(",", "")
    parts = rest.split(",")
    ascii_digits = digits.isascii() and digits.isdigit() and "" not in parts  # "": the prefix alone
    if not (starts and text.count(AS_ID) == n and len(parts) == n and ascii_digits):
        raise EngineError(f"engine's logprobs tokens are not token ids: {tokens[:3]}")
    return [int(t) for t in parts]


def check_count(n: int, usage: dict[str, Any] | None) -> None:
    """``EngineError`` unless the engine's own count of completion tokens (its ``usage``, where
    it sent one) is the ``n`` ids read: a dropped or doubled id would shift every logprob the
    trainer sees after it."""
    reported = (usage or {}).get("completion_tokens")
    if reported is not None and int(reported) != n:
        raise EngineError(f"engine counted {reported} completion tokens but sent {n} token ids")


def _logprob(entry: Any) -> float:
    # vLLM reports -inf for impossible tokens under constraints; keep the record finite.
    v = float(entry) if entry is not None else 0.0
    return v if math.isfinite(v) else -1e4


def token_logprobs(choice: dict[str, Any], n: int) -> list[float]:
    """The sampled tokens' logprobs, one per id (``n``)."""
    return logprob_values((choice.get("logprobs") or {}).get("token_logprobs") or [], n)


def logprob_values(raw: list[Any], n: int) -> list[float]:
    """``raw`` (the engine's ``token_logprobs``) as finite floats, one per id (``n``)."""
    try:  # the usual answer, all finite numbers, without a call per token
        values = [float(x) for x in raw]
        finite = math.isfinite(sum(values))  # an inf or nan anywhere makes the sum one
    except TypeError:  # a null
        finite = False
    if not finite:
        values = [_logprob(x) for x in raw]
    if len(values) != n:
        raise EngineError(f"engine returned {n} token ids but {len(values)} logprobs")
    return values


def top_logprobs(choice: dict[str, Any], n: int, k: int) -> list[list[tuple[int, float]]] | None:
    """The ``k`` likeliest (id, logprob) per position, from vLLM's ``{"token_id:N": lp}`` maps
    (which also hold the sampled token, so may have k + 1 entries); None when none were asked."""
    if not k:
        return None
    return top_of_rows((choice.get("logprobs") or {}).get("top_logprobs") or [], n, k)


def top_of_rows(rows: list[Any], n: int, k: int) -> list[list[tuple[int, float]]]:
    """The ``k`` likeliest (id, logprob) of each of the ``n`` rows of vLLM's ``top_logprobs``."""
    if len(rows) != n:
        raise EngineError(f"engine returned {n} token ids but {len(rows)} top_logprobs rows")
    out = []
    for row in rows:
        pairs = [(int(t.rpartition(":")[2]), float(v)) for t, v in (row or {}).items()]
        pairs = [(t, v) for t, v in pairs if math.isfinite(v)]  # masked by a constraint
        out.append(sorted(pairs, key=lambda p: -p[1])[:k])
    return out
