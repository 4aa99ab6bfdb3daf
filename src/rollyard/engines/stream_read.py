"""Reading an engine's streamed completion: whatever arrived together is one delta.

vLLM sends an event per token and request. When the gateway keeps up, each read holds one
event and nothing changes. When it falls behind (a burst, a loaded host), a stream's events pile
up in its socket; reading them one line at a time then cost the gateway a parse, a text piece,
an SSE frame and a socket write per token, the most exactly when it had the least time. Merged
per read, the piled-up tokens go to the client as one piece: the same ids, logprobs and text,
in fewer, larger frames, and the gateway's cost per token falls as its load rises.
"""

from __future__ import annotations

from rollyard.engines.base import CompletionDelta

__all__ = ["SSEPayloads", "merge_deltas"]


class SSEPayloads:
    """The ``data:`` payloads of server-sent events, from bytes as they arrive (a line split
    across reads is kept until its end comes)."""

    def __init__(self) -> None:
        self._tail = b""

    def feed(self, chunk: bytes) -> list[str]:
        """Payloads of the lines ``chunk`` completes; b"" (the end of the body) flushes the rest."""
        if chunk:
            *lines, self._tail = (self._tail + chunk).split(b"\n")
        else:
            lines, self._tail = [self._tail], b""
        out = []
        for raw in lines:
            line = raw.decode().strip()  # a multi-byte character never holds a b"\n"
            if line.startswith("data:"):
                out.append(line[5:].strip())
        return out


def merge_deltas(deltas: list[CompletionDelta]) -> CompletionDelta:
    """Consecutive deltas of one request as one: ids, logprobs and alternatives in order, the
    last finish reason given."""
    if len(deltas) == 1:
        return deltas[0]
    tops = [d.top_logprobs for d in deltas]
    top = None
    if any(t is not None for t in tops):
        top = [alts for d, t in zip(deltas, tops, strict=True) for alts in (t or [[] for _ in d.token_ids])]
    reasons = [d.finish_reason for d in deltas if d.finish_reason is not None]
    return CompletionDelta(
        token_ids=[t for d in deltas for t in d.token_ids],
        logprobs=[lp for d in deltas for lp in d.logprobs],
        finish_reason=reasons[-1] if reasons else None,
        prompt_tokens=deltas[-1].prompt_tokens,
        policy_version=deltas[-1].policy_version,
        top_logprobs=top,
    )
