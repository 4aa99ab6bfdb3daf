"""TextStreamer decodes incrementally, and releases exactly what decoding the whole completion
at every delta released (the oracle below), for any ids in any chunking."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core.errors import EngineUnavailable
from rollyard.core.trajectory import FinishReason
from rollyard.engines.base import CompletionDelta
from rollyard.engines.chat_template import THINK_OPEN, TOOL_CALL_OPEN
from rollyard.gateway.streaming import StreamedText, TextStreamer, _partial_marker
from rollyard.gateway.tokenizer import FastTokenizer


def _partial_marker_by_suffixes(text: str, marker: str) -> int:
    """The longest suffix of ``text`` that is a proper prefix of ``marker``, every length tried."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:n]):
            return n
    return 0


@given(st.text(alphabet="<tol_ca>x", max_size=30), st.sampled_from([TOOL_CALL_OPEN, THINK_OPEN, "<<a"]))
def test_the_partial_marker_is_the_longest_suffix_that_starts_the_marker(text: str, marker: str) -> None:
    assert _partial_marker(text, marker) == _partial_marker_by_suffixes(text, marker)


class WholeDecode:
    """The reference: decode every id so far at each delta (what TextStreamer did before)."""

    def __init__(self, tok: FastTokenizer) -> None:
        self.tok, self.ids, self.sent, self.held = tok, [], "", False

    def feed(self, ids: list[int]) -> str:
        self.ids += ids
        if self.held:
            return ""
        body = self.ids[:-1] if self.ids and self.ids[-1] == self.tok.eos_id else self.ids
        text = self.tok.decode(body)
        if text.startswith(THINK_OPEN) or THINK_OPEN.startswith(text):
            self.held = text.startswith(THINK_OPEN)
            return ""
        cut = text.find(TOOL_CALL_OPEN)
        if cut >= 0:
            self.held, safe = True, text[:cut]
        else:
            safe = text[: len(text) - _partial_marker_by_suffixes(text, TOOL_CALL_OPEN)]
        safe = safe.rstrip("\ufffd")
        if not safe.startswith(self.sent):
            return ""
        new, self.sent = safe[len(self.sent) :], safe
        return new


_PIECES = st.sampled_from(
    ["hello", " world", "é", "日本語", "🙂", "\n", TOOL_CALL_OPEN, "<tool", THINK_OPEN, "<th", "\ufffd", "x"]
)


def _chunks(ids: list[int], cuts: list[int]) -> list[list[int]]:
    points = sorted({c % (len(ids) + 1) for c in cuts} | {0, len(ids)})
    return [ids[a:b] for a, b in itertools.pairwise(points)]


def _same_releases(tok: FastTokenizer, ids: list[int], cuts: list[int]) -> None:
    new, ref = TextStreamer(tok), WholeDecode(tok)
    for chunk in _chunks(ids, cuts):
        assert new.feed(chunk) == ref.feed(chunk), (ids, cuts)
    assert new.sent == ref.sent and new.held == ref.held


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_PIECES, max_size=25), st.lists(st.integers(0, 200), max_size=12), st.booleans())
def test_text_streams_as_whole_decoding_did(
    tok: FastTokenizer, pieces: list[str], cuts: list[int], eos: bool
) -> None:
    ids = tok.encode("".join(pieces)) + ([tok.eos_id] if eos else [])
    _same_releases(tok, ids, cuts)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.integers(0, 2047), max_size=40), st.lists(st.integers(0, 200), max_size=12))
def test_any_ids_even_split_characters_stream_as_whole_decoding_did(
    tok: FastTokenizer, ids: list[int], cuts: list[int]
) -> None:
    """Random ids: byte tokens that end or start a multi-byte character mid-way, special tokens."""
    ids = [i for i in ids if i < tok.vocab_size]
    _same_releases(tok, ids, cuts)


def test_a_rewind_to_before_decoded_ids_decodes_the_kept_ones_afresh(tok: FastTokenizer) -> None:
    s = TextStreamer(tok)
    ids = tok.encode("<think>")  # held: nothing released, so the stream can rewind
    s.feed(ids[:1])
    mark = s.mark()
    s.feed(ids[1:] + tok.encode(" more"))
    assert s.rewind(mark)
    assert s.text == tok.decode(ids[:1]) and s.feed(tok.encode("x")) == ""


def test_a_long_answer_decodes_each_token_a_bounded_number_of_times(tiny_model_dir: Path) -> None:
    """4,000 tokens streamed one at a time: ~4 token decodes per token (the window), not the
    ~8 million of decoding the whole answer at every delta (1.7 s of the event loop)."""
    tok = FastTokenizer(tiny_model_dir)  # its own: decode is counted below
    ids = tok.encode("def f(x):\n    return x * 2  # a line of code, words and 12345\n" * 200)[:4000]
    decoded = 0
    real = tok.decode

    def counting(part: list[int]) -> str:
        nonlocal decoded
        decoded += len(part)
        return real(part)

    s = TextStreamer(tok)
    tok.decode = counting  # type: ignore[method-assign]
    for i in ids:
        s.feed([i])
    assert s.sent == real(ids)
    assert decoded <= 6 * len(ids), decoded


class _Stream:
    """An engine's deltas, then (maybe) its error; records whether it was closed."""

    def __init__(self, deltas: list[CompletionDelta], error: Exception | None = None) -> None:
        self.deltas, self.error, self.closed = deltas, error, False

    async def gen(self) -> AsyncIterator[CompletionDelta]:
        try:
            for d in self.deltas:
                yield d
            if self.error is not None:
                raise self.error
        finally:
            self.closed = True


def _deltas(tok: FastTokenizer, text: str) -> list[CompletionDelta]:
    ids = tok.encode(text)
    return [CompletionDelta(token_ids=[t], logprobs=[-0.5]) for t in ids[:-1]] + [
        CompletionDelta(
            token_ids=ids[-1:], logprobs=[-0.5], finish_reason=FinishReason.STOP, policy_version=3
        )
    ]


async def test_streamed_text_reads_the_pieces_then_the_whole_completion(tok: FastTokenizer) -> None:
    stream = _Stream(_deltas(tok, "hello there, friend"))
    streamed = StreamedText(stream.gen(), TextStreamer(tok), 7, "e0", top=False)
    pieces = [p async for p in streamed]
    got = await streamed.result()
    assert "".join(pieces) == "hello there, friend"
    assert got.token_ids == tok.encode("hello there, friend") and got.prompt_tokens == 7
    assert (got.finish_reason, got.policy_version, got.engine) == (FinishReason.STOP, 3, "e0")


async def test_an_engine_error_ends_the_pieces_and_is_raised_by_the_result(tok: FastTokenizer) -> None:
    stream = _Stream(_deltas(tok, "hello there")[:1], EngineUnavailable("engine dropped the stream"))
    streamed = StreamedText(stream.gen(), TextStreamer(tok), 7, "e0", top=False)
    assert [p async for p in streamed]  # the piece before the error, then the end
    with pytest.raises(EngineUnavailable, match="dropped"):
        await streamed.result()


async def test_a_reader_that_stops_early_leaves_the_rest_to_the_result_or_to_aclose(
    tok: FastTokenizer,
) -> None:
    stream = _Stream(_deltas(tok, "hello there, friend"))
    streamed = StreamedText(stream.gen(), TextStreamer(tok), 7, "e0", top=False)
    await anext(streamed)
    assert (await streamed.result()).token_ids == tok.encode("hello there, friend")  # read to the end
    left = _Stream(_deltas(tok, "hello there, friend"))
    open_one = StreamedText(left.gen(), TextStreamer(tok), 7, "e0", top=False)
    await anext(open_one)
    assert not left.closed
    await open_one.aclose()  # the engine's stream closed, not left to the garbage collector
    assert left.closed
