"""Messages to token ids, token-exact across turns.

The chat format is concatenative (engines.chat_template), so a conversation's ids are the
concatenation of its messages' ids. When a request's messages are the previous request's
messages plus the assistant message the gateway returned plus new ones, the previous prompt
and completion ids are reused verbatim and only the new messages are tokenized. Anything else
(truncation, summary, edited history, changed tools) is a rewrite: rendered fresh, and the
caller starts a new segment.

A completion that did not end with eos (finished by length, or aborted) is closed by
appending the eos id before the next message; that token is part of the next prompt, so it is
never trained on.

Dropped reasoning is not a rewrite. An echoed assistant message that omits the reasoning
the gateway returned (``reasoning_content`` / thinking) still extends the conversation; one
whose reasoning is present but different is a rewrite (``assistant_message_edited``).
Why: SDK clients drop reasoning by design (OpenAI Chat Completions has no request field for
it; most agents never echo it), so a strict rule would make every turn of a thinking model a
new segment. It stays token-exact because the previous completion ids, reasoning included,
are reused verbatim: the engine sees the reasoning, and the turn records exactly what it saw.
The cost: a client that drops thinking to save context saves nothing here; context limits and
``Program.context_tokens`` count the real ids. Agents that truncate or summarize still start
a new segment.
"""

from __future__ import annotations

import asyncio
import functools
import json
from array import array
from dataclasses import dataclass, field
from operator import is_
from typing import Any

from rollyard.core.errors import ContextLengthExceeded
from rollyard.core.prompt_ids import PromptIds, shared_ids
from rollyard.engines import chat_template as ct
from rollyard.gateway.tokenizer import Tokenizer
from rollyard.gateway.types import ChatRequest, Message, Tool, ToolCall


def tools_key(tools: list[Tool]) -> str:
    if not tools:  # most requests: json.dumps([]) is "[]", without building an encoder (~2.5 us)
        return "[]"
    return json.dumps([t.to_dict() for t in tools], sort_keys=True)


@dataclass
class ConversationState:
    """What a program's next request must extend to reuse ids verbatim.

    ``prompt_ids`` is the conversation's own list: the program's next turn extends it in place
    (``Renderer.arender(..., in_place=True)``, under the program's turn lock) instead of
    copying the history each turn, so only its first ``prompt_len`` ids are this state's
    prompt. A turn that fails after its render leaves ids past them, which the next render
    cuts off; every other reader takes ``prompt()``."""

    messages: list[Message]
    tools_key: str
    returned: Message
    prompt_ids: list[int]
    completion_ids: list[int]
    turn_index: int = 0
    segment: int = 0
    response_id: str = ""
    prompt_len: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self.prompt_len = len(self.prompt_ids)

    def prompt(self) -> list[int]:
        """This state's prompt ids, as recorded (the list itself while nothing extended it)."""
        ids = self.prompt_ids
        return ids if len(ids) == self.prompt_len else ids[: self.prompt_len]

    @property
    def known_tokens(self) -> int:
        """The ids the next turn reuses: the prompt and the completion."""
        return self.prompt_len + len(self.completion_ids)

    def to_json(self, since: int = 0) -> dict[str, Any]:
        """Everything but the ids: they are turn ``turn_index``'s prompt and completion, which
        the journal already holds in that turn's row (written in the same transaction), so a
        long context is serialized and stored once per turn, not twice. ``since``: only the
        messages from there on (the journal stores what a turn adds to the previous state)."""
        return {
            "messages": [_msg_json(m) for m in self.messages[since:]],
            "tools_key": self.tools_key,
            "returned": _msg_json(self.returned),
            "turn_index": self.turn_index,
            "segment": self.segment,
            "response_id": self.response_id,
        }

    @classmethod
    def from_json(
        cls, d: dict[str, Any], prompt_ids: list[int], completion_ids: list[int]
    ) -> ConversationState:
        """``d`` from ``to_json``; the ids from turn ``d["turn_index"]`` (journals written before
        the ids moved out carry their own copy, which wins)."""
        return cls(
            messages=[_msg_from(m) for m in d["messages"]],
            tools_key=d["tools_key"],
            returned=_msg_from(d["returned"]),
            prompt_ids=shared_ids(d.get("prompt_ids", prompt_ids)),
            completion_ids=shared_ids(d.get("completion_ids", completion_ids)),
            turn_index=int(d["turn_index"]),
            segment=int(d["segment"]),
            response_id=d.get("response_id", ""),
        )


def _msg_json(m: Message) -> dict[str, Any]:
    return {
        "role": m.role,
        "content": m.content,
        "tool_calls": [{"name": c.name, "arguments": c.arguments, "id": c.id} for c in m.tool_calls],
        "reasoning": m.reasoning,
        "tool_call_id": m.tool_call_id,
    }


def _msg_from(d: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(c["name"], c["arguments"], c.get("id", "")) for c in d.get("tool_calls", []))
    return Message(d["role"], d["content"], calls, d.get("reasoning"), d.get("tool_call_id"))


@dataclass
class RenderPlan:
    prompt_ids: list[int]
    reused_tokens: int = 0  # ids taken verbatim from the previous turn
    extends: bool = False  # True: same segment as the previous turn
    rewrite_reason: str | None = None  # why a previous conversation was not extended
    closed_with_eos: bool = False
    new_message_ids: list[list[int]] = field(default_factory=list)
    tools_key: str = "[]"  # the request's tools, as compared with the next request's


_FIRST_CACHE_SIZE = 256
_FIRST_CACHE_MAX_CHARS = 256 * 1024  # 256 entries of at most this: <= ~128 MB, text and ids
OFFLOAD_CHARS = 32_768  # requests with more text are rendered in a worker thread


RENDER_CHARS_PER_MESSAGE = 64  # a message's template work, in characters of text


def request_chars(request: ChatRequest, state: ConversationState | None = None) -> int:
    """A cheap estimate of a render's cost, in characters: the text it would tokenize (tools
    counted roughly) and a fixed share per message (templating, tool calls), so a body of many
    empty messages is not taken for a cheap one. With the ``state`` the request extends, only
    the messages after it: the rest is not rendered again."""
    if state is not None:
        return sum(_chars(m) for m in request.messages[len(state.messages) + 1 :])
    n = sum(_chars(m) for m in request.messages)
    return n + sum(len(t.description) + 256 for t in request.tools)


def _chars(m: Message) -> int:
    return len(m.content) + len(m.reasoning or "") + RENDER_CHARS_PER_MESSAGE


class Renderer:
    """Renders ``ChatRequest`` messages to prompt ids, and completions back to messages."""

    def __init__(self, tokenizer: Tokenizer, offload_chars: int = OFFLOAD_CHARS) -> None:
        self.tok = tokenizer
        self.offload_chars = offload_chars
        self.gen_prompt_ids = shared_ids(tokenizer.encode(ct.render_generation_prompt()))
        # First messages (system prompt + tools block) repeat across a task's programs and are
        # often the longest text in a request: their ids are kept, keyed by the rendered text.
        self._first_ids = functools.lru_cache(maxsize=_FIRST_CACHE_SIZE)(
            lambda text: array("i", tokenizer.encode(text))  # 4 bytes an id, not ~36
        )

    def message_ids(self, message: Message, tools: list[Tool], first: bool) -> list[int]:
        tpl_tools = [t.to_template() for t in tools] or None
        text = ct.render_message(message.to_template(), tpl_tools, first=first)
        if not first or len(text) > _FIRST_CACHE_MAX_CHARS:  # the cache is bounded in bytes too
            return shared_ids(self.tok.encode(text))
        return shared_ids(self._first_ids(text))  # a fresh list: callers extend it in place

    def render_fresh(self, request: ChatRequest) -> list[int]:
        msgs = list(request.messages)
        if request.tools and (not msgs or msgs[0].role != "system"):
            msgs.insert(0, Message("system", ""))
        ids = PromptIds()
        for i, m in enumerate(msgs):
            ids += self.message_ids(m, request.tools, first=(i == 0))
        ids += self.gen_prompt_ids
        return ids

    def check_fits(
        self, request: ChatRequest | str, limit: int, extends: ConversationState | None = None
    ) -> None:
        """Refuse, without tokenizing, text too long to fit ``limit`` tokens whatever its ids.

        A request that ``extends`` a conversation state is checked by its new messages alone,
        against what the state's known ids leave of ``limit`` (only the new text is tokenized):
        summing every message's length each turn cost ~70 ns a message, ~0.1 ms a turn at 1,400
        messages (an agent's history of short tool outputs)."""
        longest = getattr(self.tok, "max_token_chars", 0)
        if not longest:
            return
        known = 0 if extends is None else extends.known_tokens
        if isinstance(request, str):
            chars = len(request)
        else:
            new = request.messages if extends is None else request.messages[len(extends.messages) + 1 :]
            chars = sum(len(m.content) + len(m.reasoning or "") for m in new)
        if chars <= (limit - known) * longest:
            return
        if extends is None:
            raise ContextLengthExceeded(
                f"the prompt has {chars} characters, more than {limit} tokens can hold "
                f"(this program's context limit is {limit} tokens)"
            )
        raise ContextLengthExceeded(
            f"the new messages have {chars} characters, more than the {max(limit - known, 0)} "
            f"tokens left after the conversation's {known} can hold (this program's context "
            f"limit is {limit} tokens)"
        )

    async def arender(
        self,
        request: ChatRequest,
        state: ConversationState | None,
        limit: int | None = None,
        *,
        in_place: bool = False,
    ) -> RenderPlan:
        """``render``, tokenizing in a worker thread for large requests: a multi-megabyte prompt
        must not stall the event loop (``/health``, every other program) while it is tokenized.
        With a ``limit``, text that cannot fit it is refused first (``check_fits``). The ids
        are assembled on the loop: an extension ``in_place`` appends to the state's own list,
        which a worker thread left running by a cancelled request must not still be touching
        when the program's next turn does."""
        key = tools_key(request.tools)
        reason = None if state is None else self._mismatch(request, key, state)
        extended = state if state is not None and reason is None else None
        if limit is not None:
            self.check_fits(request, limit, extended)
        large = request_chars(request, extended) > self.offload_chars
        if extended is None:
            if large:
                return await asyncio.to_thread(self._render_fresh, request, key, reason)
            return self._render_fresh(request, key, reason)
        new = await asyncio.to_thread(self._new_ids, request, extended) if large else None
        return self._extend(request, extended, key, in_place, new)

    async def aencode(self, text: str) -> list[int]:
        if len(text) <= self.offload_chars:
            return self.tok.encode(text)
        return await asyncio.to_thread(self.tok.encode, text)

    def render(
        self, request: ChatRequest, state: ConversationState | None, *, in_place: bool = False
    ) -> RenderPlan:
        """Reuse the previous turn's ids when the request extends it; else render fresh.

        ``in_place``: the extension appends to ``state``'s own id list (``ConversationState``)
        instead of a copy of it: only for the program's turn itself, which alone extends its
        conversation. Why: copying the history's ids into a new list each turn (and freeing the
        previous one) cost ~0.13 ms a turn more at 20k ids than at 3k, in-process; in place, a
        turn's work does not grow with its history. ``count_tokens`` and the like render a copy."""
        key = tools_key(request.tools)
        reason = None if state is None else self._mismatch(request, key, state)
        if state is None or reason is not None:
            return self._render_fresh(request, key, reason)
        return self._extend(request, state, key, in_place)

    def _render_fresh(self, request: ChatRequest, key: str, reason: str | None) -> RenderPlan:
        return RenderPlan(self.render_fresh(request), rewrite_reason=reason, tools_key=key)

    def _new_ids(self, request: ChatRequest, state: ConversationState) -> list[list[int]]:
        """The ids of the messages after ``state``'s (the only ones an extension tokenizes)."""
        return [
            self.message_ids(m, request.tools, first=False)
            for m in request.messages[len(state.messages) + 1 :]
        ]

    def _extend(
        self,
        request: ChatRequest,
        state: ConversationState,
        key: str,
        in_place: bool,
        new: list[list[int]] | None = None,
    ) -> RenderPlan:
        """The plan of a request that extends ``state``: its prompt and completion ids as they
        were (what was done with them last turn is kept), then the new messages' ids."""
        prompt = state.prompt_ids
        if in_place and isinstance(prompt, PromptIds):
            ids = prompt
            ids.truncate(state.prompt_len)  # ids a turn that failed after its render appended
            ids += shared_ids(state.completion_ids)
            ids.checked = len(ids)
        else:
            ids = PromptIds.extending(state.prompt(), state.completion_ids)
        closed = not state.completion_ids or state.completion_ids[-1] != self.tok.eos_id
        if closed:
            ids.append(self.tok.eos_id)
        reused = len(ids)
        if new is None:
            new = self._new_ids(request, state)
        for m in new:
            ids += m
        ids += self.gen_prompt_ids
        return RenderPlan(ids, reused, True, None, closed, new, key)

    @staticmethod
    def _mismatch(request: ChatRequest, key: str, state: ConversationState) -> str | None:
        """None when the request extends the state; else a short reason (recorded in the event)."""
        n = len(state.messages)
        msgs = request.messages
        if key != state.tools_key:
            return "tools_changed"
        if len(msgs) < n + 1:
            return "history_shortened"
        # the previous body's own messages, reused (body_prefix): one C loop over the history
        same_objects = all(map(is_, msgs[:n], state.messages))
        for i in range(0 if same_objects else n):
            sent, kept = msgs[i], state.messages[i]
            if sent is kept:  # the previous body's own message, reused (body_prefix)
                continue
            same = sent.content == kept.content and sent.role == kept.role
            if same and not sent.tool_calls and not kept.tool_calls:
                continue  # equal canonical forms, without making the request's (most of a history)
            if sent.canonical() != kept.canonical():
                return f"history_edited_at_{i}"
        if msgs[n].role != "assistant":  # e.g. mini-SWE-agent drops a reply it could not parse
            return "assistant_message_dropped"
        if not msgs[n].same_as_returned(state.returned):
            return "assistant_message_edited"
        if len(msgs) == n + 1:
            return "no_new_messages"
        return None

    def decode_completion(self, ids: list[int], call_prefix: str, new_call_id: Any) -> tuple[Message, bool]:
        """The assistant message for completion ids; the flag says a tool call was malformed."""
        body = ids[:-1] if ids and ids[-1] == self.tok.eos_id else ids
        parsed = ct.parse_assistant(self.tok.decode(body))
        calls = tuple(ToolCall(c.name, c.arguments, new_call_id(call_prefix)) for c in parsed.tool_calls)
        return Message("assistant", parsed.content, calls, parsed.reasoning), parsed.malformed
