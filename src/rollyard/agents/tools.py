"""The white-box agent's tools (bash, read_file, write_file, submit), run in the program's sandbox.

Names and arguments match the scripted solvers of ``rollyard.tasks`` so demonstrations and
rollouts speak one tool language. A malformed call is answered, never raised: the model sees an
error message and the loop counts it (a process-reward signal).
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rollyard.core.errors import RollyardError
from rollyard.sandbox.base import Sandbox


def _fn(name: str, description: str, props: dict[str, str], required: list[str]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
                "required": required,
            },
        },
    }


# What a white-box agent's forced turns ask for: a call to any tool ("required") or to the one
# named (OpenAI's named-function tool_choice); "auto" forces nothing. Names match ``TOOLS``.
ToolChoice = Literal["auto", "required", "bash", "read_file", "write_file", "submit"]


def tool_choice_param(choice: ToolChoice) -> str | dict[str, Any]:
    """The request's ``tool_choice`` for ``choice``."""
    if choice in ("auto", "required"):
        return choice
    return {"type": "function", "function": {"name": choice}}


TOOLS: list[dict[str, Any]] = [
    _fn("bash", "Run a shell command in the workspace.", {"command": "the command"}, ["command"]),
    _fn("read_file", "Read a workspace file.", {"path": "relative path"}, ["path"]),
    _fn(
        "write_file",
        "Write a workspace file.",
        {"path": "relative path", "content": "the new content"},
        ["path", "content"],
    ),
    _fn("submit", "Finish the task.", {"answer": "optional final answer"}, []),
]
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
_REQUIRED = {t["function"]["name"]: t["function"]["parameters"]["required"] for t in TOOLS}


class ToolOutcome(BaseModel):
    model_config = ConfigDict(extra="forbid")

    content: str
    error: bool = False  # the call itself was malformed (unknown tool, bad arguments)
    failed: bool = False  # well-formed, but the command exited non-zero, timed out or the I/O failed
    exit_code: int | None = None  # bash only
    timed_out: bool = False
    submitted: bool = False
    answer: str | None = None


def truncate(text: str, limit: int) -> str:
    """Keep the head and tail of long output, saying how much was cut."""
    if len(text) <= limit:
        return text
    head = limit // 2
    tail = limit - head
    return f"{text[:head]}\n[... {len(text) - limit} characters truncated ...]\n{text[-tail:]}"


def parse_arguments(name: str, raw: str | None) -> dict[str, Any] | str:
    """The call's arguments, or an error message for the model."""
    if name not in TOOL_NAMES:
        return f"error: unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}"
    try:
        args = json.loads(raw or "{}")
    except json.JSONDecodeError as e:
        return f"error: arguments for {name} are not valid JSON ({e.msg})"
    except RecursionError:  # valid or not, too deep for json to read: an answer, not a crash
        return f"error: arguments for {name} are nested too deeply to read"
    if not isinstance(args, dict):
        return f"error: arguments for {name} must be a JSON object"
    missing = [k for k in _REQUIRED[name] if not isinstance(args.get(k), str)]
    if missing:
        return f"error: {name} needs string argument(s) {', '.join(missing)}"
    return args


async def run_tool(
    sandbox: Sandbox, name: str, raw_arguments: str | None, *, timeout: float, max_chars: int
) -> ToolOutcome:
    """Execute one tool call; sandbox failures become tool output, malformed calls are flagged."""
    args = parse_arguments(name, raw_arguments)
    if isinstance(args, str):
        return ToolOutcome(content=args, error=True)
    try:
        if name == "bash":
            res = await sandbox.exec(args["command"], timeout=timeout)
            out = res.stdout + (f"\n[stderr]\n{res.stderr}" if res.stderr else "")
            status = "timed out" if res.timed_out else f"exit {res.rc}"
            return ToolOutcome(
                content=truncate(f"{out.rstrip()}\n[{status}]".lstrip(), max_chars),
                failed=res.timed_out or res.rc != 0,
                exit_code=None if res.timed_out else res.rc,
                timed_out=res.timed_out,
            )
        if name == "read_file":
            data = await sandbox.read(args["path"])
            return ToolOutcome(content=truncate(data.decode(errors="replace"), max_chars))
        if name == "write_file":
            await sandbox.write(args["path"], args["content"])
            return ToolOutcome(content=f"wrote {len(args['content'])} characters to {args['path']}")
    except (RollyardError, OSError) as e:
        return ToolOutcome(content=truncate(f"error: {e}", max_chars), failed=True)
    answer = args.get("answer")
    answer = answer if isinstance(answer, str) else None
    return ToolOutcome(content="submitted", submitted=True, answer=answer)
