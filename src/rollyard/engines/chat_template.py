"""The tiny model's chat format, and the parser for its tool calls, kept side by side.

The format is *concatenative*: each message renders on its own as
``<|im_start|>{role}\\n{body}<|im_end|>`` with nothing between messages, and every marker is
an added token. So the token ids of a conversation are exactly the concatenation of each
message's ids, and a gateway can extend a previous prompt by appending the new messages'
ids without re-tokenizing history. The generation prompt is ``<|im_start|>assistant\\n``;
the model stops with ``<|im_end|>`` (its eos).

Tool calls are Hermes-style: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``
after the assistant's text. Reasoning, when present, is ``<think>...</think>`` first.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<|pad|>"
TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

SPECIAL_TOKENS = [PAD, IM_START, IM_END]
ADDED_TOKENS = [TOOL_CALL_OPEN, TOOL_CALL_CLOSE, THINK_OPEN, THINK_CLOSE]

ROLES = ("system", "user", "assistant", "tool")
_ROLE_ALIASES = {"developer": "system"}

TOOLS_HEADER = (
    "\n\n# Tools\nYou may call these functions. To call one, reply with "
    f'{TOOL_CALL_OPEN}{{"name": <name>, "arguments": <object>}}{TOOL_CALL_CLOSE}.\n<tools>\n'
)
TOOLS_FOOTER = "</tools>"


def _dumps(obj: Any) -> str:
    """The one JSON form used in prompts, so rendering is deterministic."""
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    return f"{TOOL_CALL_OPEN}{_dumps({'name': name, 'arguments': arguments})}{TOOL_CALL_CLOSE}"


def tool_call_frame(name: str) -> tuple[str, str]:
    """The text around a call's arguments object: ``format_tool_call`` is prefix + args + suffix
    (forced-call grammars constrain only the arguments between them)."""
    return f'{TOOL_CALL_OPEN}{{"name": {_dumps(name)}, "arguments": ', f"}}{TOOL_CALL_CLOSE}"


def _tool_spec(tool: dict[str, Any]) -> dict[str, Any]:
    """Accept an OpenAI tool ({type, function:{...}}) or a bare function spec."""
    fn = tool.get("function", tool)
    return {
        "name": fn.get("name", ""),
        "description": fn.get("description", ""),
        "parameters": fn.get("parameters", {}),
    }


def render_tools(tools: list[dict[str, Any]]) -> str:
    lines = "".join(_dumps(_tool_spec(t)) + "\n" for t in tools)
    return TOOLS_HEADER + lines + TOOLS_FOOTER


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    raise ValueError(f"unsupported message content {type(content).__name__}")


def render_message(
    message: dict[str, Any], tools: list[dict[str, Any]] | None = None, first: bool = False
) -> str:
    """Render one message. ``tools`` are appended to the system message when ``first``.

    Messages use the OpenAI shape: role, content, optional ``tool_calls`` (each with
    ``function.name`` and ``function.arguments`` as a JSON string or object) and optional
    ``reasoning_content``.
    """
    role = _ROLE_ALIASES.get(message.get("role", ""), message.get("role", ""))
    if role not in ROLES:
        raise ValueError(f"unknown role {message.get('role')!r}")
    body = _content_text(message.get("content"))
    if role == "system" and first and tools:
        body += render_tools(tools)
    if role == "assistant":
        reasoning = message.get("reasoning_content")
        prefix = f"{THINK_OPEN}{reasoning}{THINK_CLOSE}" if reasoning else ""
        calls = ""
        for call in message.get("tool_calls") or []:
            fn = call.get("function", call)
            args = fn.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            calls += format_tool_call(fn["name"], args)
        body = prefix + body + calls
    return f"{IM_START}{role}\n{body}{IM_END}"


def render_generation_prompt() -> str:
    return f"{IM_START}assistant\n"


def render_conversation(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The whole prompt; equals the HF ``CHAT_TEMPLATE`` rendering (tested)."""
    msgs = list(messages)
    if tools and (not msgs or _ROLE_ALIASES.get(msgs[0].get("role"), msgs[0].get("role")) != "system"):
        msgs.insert(0, {"role": "system", "content": ""})
    text = "".join(render_message(m, tools, first=(i == 0)) for i, m in enumerate(msgs))
    return text + (render_generation_prompt() if add_generation_prompt else "")


# The same format as a Jinja template, for HF tokenizers and vLLM's own chat endpoint. Jinja has
# no JSON parser, so tool-call arguments given as a JSON *string* are inserted verbatim; the
# Python renderer above (what the gateway uses) re-serializes them canonically.
CHAT_TEMPLATE = (
    "{%- set msgs = messages -%}"
    "{%- if tools and (not msgs or (msgs[0]['role'] != 'system' and msgs[0]['role'] != 'developer')) -%}"
    "{%- set msgs = [{'role': 'system', 'content': ''}] + msgs -%}"
    "{%- endif -%}"
    "{%- for m in msgs -%}"
    "{%- set role = 'system' if m['role'] == 'developer' else m['role'] -%}"
    "{{- '<|im_start|>' + role + '\\n' -}}"
    "{%- if role == 'assistant' and m.get('reasoning_content') -%}"
    "{{- '<think>' + m['reasoning_content'] + '</think>' -}}"
    "{%- endif -%}"
    "{%- if m['content'] is string -%}{{- m['content'] -}}"
    "{%- elif m['content'] -%}{%- for p in m['content'] -%}{{- p.get('text', '') -}}{%- endfor -%}"
    "{%- endif -%}"
    "{%- if role == 'system' and loop.first and tools -%}"
    "{{- '\\n\\n# Tools\\nYou may call these functions. To call one, reply with "
    '<tool_call>{"name": <name>, "arguments": <object>}</tool_call>.\\n<tools>\\n\' -}}'
    "{%- for t in tools -%}{%- set f = t['function'] if t.get('function') else t -%}"
    "{{- {'name': f.get('name', ''), 'description': f.get('description', ''),"
    " 'parameters': f.get('parameters', {})} | tojson -}}{{- '\\n' -}}"
    "{%- endfor -%}{{- '</tools>' -}}"
    "{%- endif -%}"
    "{%- if role == 'assistant' and m.get('tool_calls') -%}"
    "{%- for c in m['tool_calls'] -%}{%- set f = c['function'] if c.get('function') else c -%}"
    "{%- set a = f['arguments'] if f['arguments'] is string else (f['arguments'] | tojson) -%}"
    "{{- '<tool_call>{\"name\": ' + (f['name'] | tojson) + ', \"arguments\": ' + a + '}</tool_call>' -}}"
    "{%- endfor -%}"
    "{%- endif -%}"
    "{{- '<|im_end|>' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass
class ParsedAssistant:
    """An assistant completion split into text, reasoning and tool calls.

    ``malformed`` is True when the text contains tool-call markers that do not parse; the
    raw text is then kept as content (the caller returns it as text and flags the turn).
    """

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str | None = None
    malformed: bool = False
    errors: list[str] = field(default_factory=list)


_JSON = json.JSONDecoder()
_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace


def _call_spans(text: str) -> list[tuple[int, int, str]]:
    """Each ``<tool_call>...</tool_call>`` as (start, end, the text between the markers).

    The JSON after an opening marker is read as JSON first, so a string argument that contains
    ``</tool_call>`` (code about tool calls; a random model does it in ~0.4% of forced calls)
    stays inside its call. Text that is not JSON there ends at the next closing marker, as a
    call that will not parse."""
    spans = []
    i = text.find(TOOL_CALL_OPEN)
    while i >= 0:
        body = i + len(TOOL_CALL_OPEN)
        end = -1
        try:
            _, after = _JSON.raw_decode(text, _SPACE.match(text, body).end())  # type: ignore[union-attr]
            after = _SPACE.match(text, after).end()  # type: ignore[union-attr]
            if text.startswith(TOOL_CALL_CLOSE, after):
                end = after
        except (ValueError, RecursionError):  # not JSON, or nested past what json reads
            pass
        if end < 0:
            end = text.find(TOOL_CALL_CLOSE, body)
        if end < 0:
            break  # an opening marker never closed: left in the content, flagged as stray
        stop = end + len(TOOL_CALL_CLOSE)
        spans.append((i, stop, text[body:end]))
        i = text.find(TOOL_CALL_OPEN, stop)
    return spans


def parse_assistant(text: str) -> ParsedAssistant:
    """Parse generated assistant text (eos already stripped)."""
    text = text.removesuffix(IM_END)
    reasoning = None
    if text.startswith(THINK_OPEN) and THINK_CLOSE in text:
        reasoning, text = text[len(THINK_OPEN) :].split(THINK_CLOSE, 1)
    calls: list[ToolCall] = []
    errors: list[str] = []
    spans = _call_spans(text)
    for _, _, inner in spans:
        try:
            obj = json.loads(inner)
            if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
                raise ValueError("a tool call needs a non-empty string 'name'")
            args = obj.get("arguments", {})
            if isinstance(args, str):
                args = json.loads(args)
            if not isinstance(args, dict):
                raise ValueError("'arguments' must be an object")
            calls.append(ToolCall(obj["name"], args))
        except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError
            errors.append(str(e) or type(e).__name__)
    bounds = [0, *(b for start, stop, _ in spans for b in (start, stop)), len(text)]
    content = "".join(text[bounds[k] : bounds[k + 1]] for k in range(0, len(bounds), 2))
    stray = TOOL_CALL_OPEN in content or TOOL_CALL_CLOSE in content
    if errors or stray:
        if stray:
            errors.append("unbalanced tool-call markers")
        return ParsedAssistant(content=text, reasoning=reasoning, malformed=True, errors=errors)
    return ParsedAssistant(content=content, tool_calls=calls, reasoning=reasoning)


def tool_call_regex(names: list[str] | None = None) -> str:
    """A regex for structured outputs that forces exactly one well-formed tool call.

    Arguments are restricted to a flat JSON object of string values, enough for tests and
    for ``tool_choice: required`` with a random model.
    """
    name = "|".join(re.escape(n) for n in names) if names else r"[a-z_][a-z0-9_]{0,20}"
    value = r'"[a-zA-Z0-9 _./-]{0,24}"'
    pair = rf'"[a-z_]{{1,12}}": {value}'
    args = rf"\{{({pair}(, {pair}){{0,2}})?\}}"
    return (
        re.escape(TOOL_CALL_OPEN)
        + rf'\{{"name": "({name})", "arguments": {args}\}}'
        + re.escape(TOOL_CALL_CLOSE)
    )
