"""A minimal tool-loop agent on litellm: reads the task from the file named by AGENT_TASK_FILE,
runs ``bash`` tool calls, writes the final answer to AGENT_OUTPUT_FILE. Configured by a JSON
config file named by AGENT_CONFIG (``api_base``, ``model`` as ``openai/...``) and LITELLM_API_KEY."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import litellm

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
    task = Path(os.environ["AGENT_TASK_FILE"]).read_text()
    config = json.loads(Path(os.environ["AGENT_CONFIG"]).read_text())
    kwargs = {
        "model": config["model"],
        "api_base": config["api_base"],
        "api_key": os.environ["LITELLM_API_KEY"],
        "tools": [BASH],
    }
    messages: list[dict[str, object]] = [{"role": "user", "content": task}]
    for _ in range(int(os.environ.get("AGENT_MAX_TURNS", "10"))):
        msg = litellm.completion(messages=messages, **kwargs).choices[0].message
        calls = msg.tool_calls or []
        entry: dict[str, object] = {"role": "assistant", "content": msg.content}
        if calls:
            entry["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.function.name, "arguments": c.function.arguments},
                }
                for c in calls
            ]
        messages.append(entry)
        if not calls:
            Path(os.environ["AGENT_OUTPUT_FILE"]).write_text(msg.content or "")
            return
        for c in calls:
            out = run_bash(c.function.arguments) if c.function.name == "bash" else "error: unknown tool"
            messages.append({"role": "tool", "tool_call_id": c.id, "content": out})
    sys.exit("max turns reached")


if __name__ == "__main__":
    main()
