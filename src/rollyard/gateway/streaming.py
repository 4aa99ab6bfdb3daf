"""Which part of a growing completion may be streamed as plain text now.

Text is released only while it cannot turn out to be part of a tool call or reasoning
block; from the first ``<tool_call>`` (or a leading ``<think>``) on, everything is held and the
final message (parsed once, from the full completion ids) supplies the rest. So a streamed
answer always equals the non-streamed one, and the recorded ids are the engine's.
"""

from __future__ import annotations

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
