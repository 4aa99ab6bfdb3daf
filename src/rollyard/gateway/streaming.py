"""Which part of a growing completion may be streamed as plain text now.

Text is released only while it cannot turn out to be part of a tool call or reasoning
block; from the first ``<tool_call>`` (or a leading ``<think>``) on, everything is held and the
final message (parsed once, from the full completion ids) supplies the rest. So a streamed
answer always equals the non-streamed one, and the recorded ids are the engine's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Backend, Completion
from rollyard.engines.chat_template import THINK_OPEN, TOOL_CALL_OPEN
from rollyard.gateway.tokenizer import Tokenizer


def _partial_marker(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


class TextStreamer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        self.ids: list[int] = []
        self.sent = ""
        self.held = False

    def feed(self, ids: list[int]) -> str:
        """Add token ids; return the new text that is safe to send."""
        self.ids += ids
        if self.held:
            return ""
        body = self.ids[:-1] if self.ids and self.ids[-1] == self.tok.eos_id else self.ids
        text = self.tok.decode(body)
        if text.startswith(THINK_OPEN) or THINK_OPEN.startswith(text):
            if text.startswith(THINK_OPEN):
                self.held = True
            return ""
        cut = text.find(TOOL_CALL_OPEN)
        if cut >= 0:
            self.held = True
            safe = text[:cut]
        else:
            safe = text[: len(text) - _partial_marker(text, TOOL_CALL_OPEN)]
        safe = safe.rstrip("\ufffd")  # an incomplete UTF-8 sequence decodes to U+FFFD
        if not safe.startswith(self.sent):
            return ""
        new, self.sent = safe[len(self.sent) :], safe
        return new

    def mark(self) -> tuple[int, str, bool]:
        """Where the stream stands, to ``rewind`` to if an engine call fails."""
        return len(self.ids), self.sent, self.held

    def rewind(self, mark: tuple[int, str, bool]) -> bool:
        """Forget what was fed since ``mark`` if none of it was released as text (the caller saw
        nothing of it, so the call may be made again); False when some text was released."""
        n, sent, held = mark
        if self.sent != sent:
            return False
        del self.ids[n:]
        self.held = held
        return True

    def rest(self, final_content: str) -> str:
        """The content still to send once the final message is known."""
        return final_content[len(self.sent) :] if final_content.startswith(self.sent) else ""


async def stream_completion(
    backend: Backend, prompt_ids: list[int], params: SamplingParams, streamer: TextStreamer
) -> AsyncIterator[str | Completion]:
    """The engine's streamed deltas as releasable text pieces, then the whole ``Completion``
    (ids, logprobs, finish reason) the turn is recorded from."""
    ids: list[int] = []
    lps: list[float] = []
    top: list[list[tuple[int, float]]] | None = [] if params.top_logprobs else None
    finish = FinishReason.ABORT
    prompt_tokens, version = len(prompt_ids), 0
    async for d in backend.stream(prompt_ids, params):
        ids += d.token_ids
        lps += d.logprobs
        if top is not None:
            top += d.top_logprobs or [[] for _ in d.token_ids]
        version = d.policy_version or version
        if d.finish_reason is not None:
            finish = d.finish_reason
        yield streamer.feed(d.token_ids)
    yield Completion(
        token_ids=ids,
        logprobs=lps,
        finish_reason=finish,
        prompt_tokens=prompt_tokens,
        policy_version=version,
        engine=backend.name,
        top_logprobs=top,
    )
