"""A minimal tool-loop agent on the official Anthropic SDK: takes the task as its argument,
runs ``bash`` tool uses, prints the final text. Configured by ANTHROPIC_BASE_URL /
ANTHROPIC_API_KEY / AGENT_MODEL."""

from __future__ import annotations

import os
import subprocess
import sys

from anthropic import Anthropic

BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {
        "type": "object",
        "properties": {"command": {"type": "string"}},
        "required": ["command"],
    },
}


def run_bash(command: object) -> str:
    if not isinstance(command, str):
        return "error: bad arguments"
    p = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60)
    return (p.stdout + p.stderr)[-2000:] + f"[exit {p.returncode}]"


def main() -> None:
    client = Anthropic()
    model = os.environ.get("AGENT_MODEL", "policy")
    messages: list[dict[str, object]] = [{"role": "user", "content": sys.argv[1]}]
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "10"))):
        resp = client.messages.create(model=model, max_tokens=1024, messages=messages, tools=[BASH])
        messages.append(
            {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in resp.content]}
        )
        uses = [b for b in resp.content if b.type == "tool_use"]
        if not uses:
            print("".join(b.text for b in resp.content if b.type == "text"))
            return
        results = []
        for u in uses:
            out = run_bash(u.input.get("command")) if u.name == "bash" else "error: unknown tool"
            results.append({"type": "tool_result", "tool_use_id": u.id, "content": out})
        messages.append({"role": "user", "content": results})
    sys.exit("max turns reached")


if __name__ == "__main__":
    main()
