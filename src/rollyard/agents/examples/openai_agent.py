"""A minimal tool-loop agent on the official OpenAI SDK: reads the task on stdin, runs ``bash``
tool calls, prints the final answer. Configured only by OPENAI_BASE_URL / OPENAI_API_KEY /
AGENT_MODEL, as an unmodified third-party agent would be."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from openai import OpenAI

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "Run a shell command.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}


def run_bash(arguments: str) -> str:
    try:
        cmd = json.loads(arguments)["command"]
    except (ValueError, KeyError, TypeError):
        return "error: bad arguments"
    p = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    return (p.stdout + p.stderr)[-2000:] + f"[exit {p.returncode}]"


def main() -> None:
    client = OpenAI()
    model = os.environ.get("AGENT_MODEL", "policy")
    messages: list[dict[str, object]] = [{"role": "user", "content": sys.stdin.read()}]
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "10"))):
        msg = client.chat.completions.create(model=model, messages=messages, tools=[BASH]).choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if not msg.tool_calls:
            print(msg.content or "")
            return
        for call in msg.tool_calls:
            out = run_bash(call.function.arguments) if call.function.name == "bash" else "error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": out})
    sys.exit("max turns reached")


if __name__ == "__main__":
    main()
