"""Which part of a growing completion may be streamed as plain text now.

Text is released only while it cannot turn out to be part of a tool call or reasoning
block; from the first ``<tool_call>`` (or a leading ``<think>``) on, everything is held and the
final message (parsed once, from the full completion ids) supplies the rest. So a streamed
answer always equals the non-streamed one, and the recorded ids are the engine's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import Completion, CompletionDelta
from rollyard.engines.chat_template import THINK_OPEN, TOOL_CALL_OPEN
from rollyard.gateway.tokenizer import Tokenizer


def _partial_marker(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``: it starts
    with the marker's first character, within the last ``len(marker) - 1`` (run per token)."""
    p = text.find(marker[0], max(0, len(text) - len(marker) + 1))
    while p >= 0:
        if marker.startswith(text[p:]):
            return len(text) - p
        p = text.find(marker[0], p + 1)
    return 0


class TextStreamer:
    """The releasable text of a growing completion, decoded incrementally.

    Each new piece of ids is decoded in a short window that starts at the previous piece (the
    tokenizer's decoder sees the tokens before it, as vLLM's detokenizer does), so a delta costs
    the same at token 4,000 as at token 4: decoding the whole completion at every delta cost
    1.7 s of the event loop for one 4,000-token streamed answer (0.8 ms per token at the end).
    With a byte-level decoder (``FastTokenizer.concatenative``) the piece is decoded alone: what
    was kept always ends on a whole character, so the window's text is the kept text plus it.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        # one decode per piece where the decoder allows it (the two-decode window otherwise)
        self._concatenative = getattr(tokenizer, "concatenative", False)
        self.ids: list[int] = []
        self.text = ""  # the decoded text of ids[: self._read]
        self._prefix = 0  # where the next decode window starts
        self._read = 0
        self.sent = ""
        self.held = False

    def _decoded(self, end: int) -> str:
        """The text of ``ids[:end]``. What is decoded is kept (``text``) up to the last piece that
        ends in a whole character; one that ends in U+FFFD (a multi-byte character cut short, or
        bytes that never make one) is decoded again with the next ids, so every window starts at
        a character boundary."""
        if end <= self._read:
            return self.text
        if self._concatenative:  # what was kept ends on a whole character: the piece alone
            return self._kept(self.tok.decode(self.ids[self._read : end]), end)
        before = self.tok.decode(self.ids[self._prefix : self._read])
        window = self.tok.decode(self.ids[self._prefix : end])
        if not window.startswith(before):  # a decoder that rewrites earlier text: decode it all
            self.text, self._prefix, self._read = self.tok.decode(self.ids[:end]), end, end
            return self.text
        return self._kept(window[len(before) :], end)

    def _kept(self, piece: str, end: int) -> str:
        """The text with ``piece`` (the text of ``ids[_read:end]``) after it, kept when whole."""
        if piece.endswith("\ufffd"):  # maybe a character cut short: keep the window open
            return self.text + piece
        self.text += piece
        self._prefix, self._read = self._read, end
        return self.text

    def feed(self, ids: list[int]) -> str:
        """Add token ids; return the new text that is safe to send."""
        if (
            self._concatenative
            and not self.held
            and self._read == len(self.ids)
            and len(self.sent) == len(self.text)
        ):
            # Everything decoded so far was sent: a piece with no "<" (no marker, nor the start of
            # one) that decodes to whole characters is sent as it is (``_plain``).
            plain = self._plain(ids)
            if plain is not None:
                return plain
        self.ids += ids
        if self.held:
            return ""
        end = len(self.ids) - 1 if self.ids and self.ids[-1] == self.tok.eos_id else len(self.ids)
        text = self._decoded(end)
        if text.startswith(THINK_OPEN) or THINK_OPEN.startswith(text):
            if text.startswith(THINK_OPEN):
                self.held = True
            return ""
        # a marker starting earlier lay wholly in text already searched, and was held then
        cut = text.find(TOOL_CALL_OPEN, max(0, len(self.sent) - len(TOOL_CALL_OPEN)))
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

    def _plain(self, ids: list[int]) -> str | None:
        """The text of ``ids`` when it is all releasable at once (None: go the whole way).

        What ``feed``'s whole way gives for such a piece, in one decode and no search of the text
        kept: the caller checked that every decoded character was sent and nothing is pending."""
        if not ids or ids[-1] == self.tok.eos_id:
            return None
        piece = self.tok.decode(ids)
        if not piece or "<" in piece or piece.endswith("\ufffd"):
            return None
        self.ids += ids
        self.text += piece
        self._prefix, self._read = self._read, len(self.ids)
        self.sent = self.text
        return piece

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
        if self._read > n:  # decoded past the mark: the next feed decodes what is kept afresh
            # (from the start: the mark may cut a character, which a kept text must not end in)
            self.text, self._prefix, self._read = "", 0, 0
        return True

    def rest(self, final_content: str) -> str:
        """The content still to send once the final message is known."""
        return final_content[len(self.sent) :] if final_content.startswith(self.sent) else ""


class StreamedText:
    """One streamed engine call's releasable text pieces, iterated by the response's frames
    directly; then the whole ``Completion`` (ids, logprobs, finish reason) the turn is recorded
    from (``result``).

    Why an object and not a generator of pieces passed up: the turn's generators
    (``Gateway._generate`` and the three around it) yield it once, instead of each passing on
    every piece, both ways, for every streamed token. An error of the engine call ends the
    iteration and is kept, for ``result`` to raise in ``_generate``'s own frame, where its retry
    and its accounting are, as when the pieces passed through it."""

    def __init__(
        self,
        deltas: AsyncIterator[CompletionDelta],
        streamer: TextStreamer,
        prompt_tokens: int,
        engine: str,
        top: bool,
    ) -> None:
        self._deltas = deltas
        self._streamer = streamer
        self._prompt_tokens, self._engine = prompt_tokens, engine
        self._ids: list[int] = []
        self._lps: list[float] = []
        self._top: list[list[tuple[int, float]]] | None = [] if top else None
        self._finish = FinishReason.ABORT
        self._version = 0
        self._done = False
        self._error: BaseException | None = None

    def __aiter__(self) -> StreamedText:
        return self

    async def __anext__(self) -> str:
        if self._done:
            raise StopAsyncIteration
        while True:
            try:
                d = await self._deltas.__anext__()
            except StopAsyncIteration:
                self._done = True
                raise
            except Exception as e:  # the engine call's: ``result`` raises it where it is handled
                self._done, self._error = True, e
                raise StopAsyncIteration from None
            self._ids += d.token_ids
            self._lps += d.logprobs
            if self._top is not None:
                self._top += d.top_logprobs or [[] for _ in d.token_ids]
            self._version = d.policy_version or self._version
            if d.finish_reason is not None:
                self._finish = d.finish_reason
            piece = self._streamer.feed(d.token_ids)
            if piece:
                return piece

    async def result(self) -> Completion:
        """The whole completion once the stream has ended (what the frames did not read is read
        here); the engine call's error, raised."""
        async for _ in self:
            pass
        if self._error is not None:
            raise self._error
        return Completion(
            token_ids=self._ids,
            logprobs=self._lps,
            finish_reason=self._finish,
            prompt_tokens=self._prompt_tokens,
            policy_version=self._version,
            engine=self._engine,
            top_logprobs=self._top,
        )

    async def aclose(self) -> None:
        """Close the engine's stream if it was left open (a reader that stopped early)."""
        close = getattr(self._deltas, "aclose", None)
        if close is not None:
            await close()
