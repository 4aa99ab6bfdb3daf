"""Which part of a growing completion may be streamed as plain text now.

Text is released only while it cannot turn out to be part of a tool call or reasoning
block; from the first ``<tool_call>`` (or a leading ``<think>``) on, everything is held and the
final message (parsed once, from the full completion ids) supplies the rest. So a streamed
answer always equals the non-streamed one, and the recorded ids are the engine's.
"""

from __future__ import annotations

import weakref
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

    The common token (a byte-level decoder, everything decoded so far sent, one id whose text is
    whole characters with no ``<``) is sent from a table of such ids' texts, kept per tokenizer
    and filled as streams meet them: no decode, no search, its text appended to a list joined
    when the whole text is next needed. Per token this was ~6% of the gateway's CPU on a
    streamed request (64 streams, canned engine) before it had its own few lines.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tok = tokenizer
        # one decode per piece where the decoder allows it (the two-decode window otherwise)
        self._concatenative = getattr(tokenizer, "concatenative", False)
        self.ids: list[int] = []
        self._text = ""  # the decoded text of ids[: self._read] (less ``_tail``)
        self._prefix = 0  # where the next decode window starts
        self._read = 0
        self._sent = ""  # (less ``_tail``)
        self._tail: list[str] = []  # pieces sent by ``feed``'s first lines, in text and sent both
        self.held = False
        self._plain = _plain_texts(tokenizer) if self._concatenative else {}
        self._vocab = getattr(tokenizer, "vocab_size", 0) if self._concatenative else 0
        self._clean = self._concatenative  # everything decoded was sent; nothing held or pending

    @property
    def text(self) -> str:
        """The decoded text kept so far."""
        self._flush()
        return self._text

    @property
    def sent(self) -> str:
        """The text released so far."""
        self._flush()
        return self._sent

    def _flush(self) -> None:
        if self._tail:  # only ever filled while clean, when the text and the sent text are one
            self._text = self._sent = self._text + "".join(self._tail)
            self._tail.clear()

    def _decoded(self, end: int, piece: str | None = None) -> str:
        """The text of ``ids[:end]``. What is decoded is kept (``text``) up to the last piece that
        ends in a whole character; one that ends in U+FFFD (a multi-byte character cut short, or
        bytes that never make one) is decoded again with the next ids, so every window starts at
        a character boundary. ``piece``: the text of ``ids[_read:end]``, when decoded already."""
        if end <= self._read:
            return self._text
        if self._concatenative:  # what was kept ends on a whole character: the piece alone
            if piece is None:
                piece = self.tok.decode(self.ids[self._read : end])
            return self._kept(piece, end)
        before = self.tok.decode(self.ids[self._prefix : self._read])
        window = self.tok.decode(self.ids[self._prefix : end])
        if not window.startswith(before):  # a decoder that rewrites earlier text: decode it all
            self._text, self._prefix, self._read = self.tok.decode(self.ids[:end]), end, end
            return self._text
        return self._kept(window[len(before) :], end)

    def _kept(self, piece: str, end: int) -> str:
        """The text with ``piece`` (the text of ``ids[_read:end]``) after it, kept when whole."""
        if piece.endswith("\ufffd"):  # maybe a character cut short: keep the window open
            return self._text + piece
        self._text += piece
        self._prefix, self._read = self._read, end
        return self._text

    def feed(self, ids: list[int]) -> str:
        """Add token ids; return the new text that is safe to send."""
        if self._clean and len(ids) == 1:
            piece = self._plain.get(ids[0])
            if piece is not None:  # the common token: its known text, whole and with no "<"
                self.ids.append(ids[0])
                self._read += 1
                self._tail.append(piece)
                return piece
        self._flush()
        new = self._feed(ids)
        self._clean = self._is_clean()
        return new

    def _is_clean(self) -> bool:
        """Everything decoded so far was sent, and nothing is held or pending (``_tail`` empty)."""
        return (
            self._concatenative
            and not self.held
            and self._read == len(self.ids)
            and len(self._sent) == len(self._text)
        )

    def _feed(self, ids: list[int]) -> str:
        piece = None  # the text of ``ids`` when decoded already (clean: all that is new)
        if self._clean and ids and ids[-1] != self.tok.eos_id:
            # Everything decoded so far was sent: a piece with no "<" (no marker, nor the start of
            # one) that decodes to whole characters is sent as it is.
            piece = self.tok.decode(ids)
            if piece and "<" not in piece and not piece.endswith("\ufffd"):
                return self._plain_piece(ids, piece)
        self.ids += ids
        if self.held:
            return ""
        end = len(self.ids) - 1 if self.ids and self.ids[-1] == self.tok.eos_id else len(self.ids)
        text = self._decoded(end, piece)
        if text.startswith(THINK_OPEN) or THINK_OPEN.startswith(text):
            if text.startswith(THINK_OPEN):
                self.held = True
            return ""
        # a marker starting earlier lay wholly in text already searched, and was held then
        cut = text.find(TOOL_CALL_OPEN, max(0, len(self._sent) - len(TOOL_CALL_OPEN)))
        if cut >= 0:
            self.held = True
            safe = text[:cut]
        else:
            safe = text[: len(text) - _partial_marker(text, TOOL_CALL_OPEN)]
        safe = safe.rstrip("\ufffd")  # an incomplete UTF-8 sequence decodes to U+FFFD
        if not safe.startswith(self._sent):
            return ""
        new, self._sent = safe[len(self._sent) :], safe
        return new

    def _plain_piece(self, ids: list[int], piece: str) -> str:
        """``piece``, the text of ``ids``, released at once: what ``_feed``'s whole way gives for
        it, with no search of the text kept (the caller checked that every decoded character was
        sent, nothing is pending, and the piece is whole characters with no "<"). One id's text
        found so is remembered for ``feed``'s first lines."""
        if len(ids) == 1 and 0 <= ids[0] < self._vocab:  # bounded by the vocabulary
            self._plain[ids[0]] = piece
        self.ids += ids
        self._text += piece
        self._prefix, self._read = self._read, len(self.ids)
        self._sent = self._text
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
            self._text, self._prefix, self._read = "", 0, 0
        self._clean = self._is_clean()
        return True

    def rest(self, final_content: str) -> str:
        """The content still to send once the final message is known."""
        sent = self.sent
        return final_content[len(sent) :] if final_content.startswith(sent) else ""


# one table per tokenizer (``TextStreamer._plain``): an id's text never changes
_PLAIN: weakref.WeakKeyDictionary[Tokenizer, dict[int, str]] = weakref.WeakKeyDictionary()


def _plain_texts(tokenizer: Tokenizer) -> dict[int, str]:
    table = _PLAIN.get(tokenizer)
    if table is None:
        table = _PLAIN[tokenizer] = {}
    return table


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
