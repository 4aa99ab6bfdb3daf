"""A minimal agent CLI (stdlib only): one chat call, then either reads the data or guesses.

Task (lookup family): "Find the value of KEY in data/ and write it to answer.txt." The model's
reply decides the policy's action: an even-length reply means "look it up" (grep data/ and copy
the value), an odd one means "guess". So success depends on what the policy sampled, which is
what lets a training step through this CLI get a non-zero gradient.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sys
import urllib.request


def ask(task: str) -> str:
    body = {
        "model": os.environ.get("AGENT_MODEL", "policy"),
        "messages": [{"role": "user", "content": task}],
        "max_tokens": 8,
    }
    req = urllib.request.Request(
        os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={
            "Authorization": f"Bearer {os.environ['OPENAI_API_KEY']}",
            "Content-Type": "application/json",
        },
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.load(r)["choices"][0]["message"]["content"] or ""


def main() -> None:
    task = " ".join(sys.argv[1:])
    m = re.search(r"value of (\w+)", task)
    if m is None:
        sys.exit(f"byo-agent: no key in the task {task!r}")
    reply = ask(task)
    value = "00"
    if len(reply) % 2 == 0:
        for f in sorted(pathlib.Path("data").glob("*.txt")):
            for line in f.read_text().splitlines():
                if line.startswith(m.group(1) + "="):
                    value = line.split("=", 1)[1]
    pathlib.Path("answer.txt").write_text(value + "\n")
    print(f"wrote {value}")


if __name__ == "__main__":
    main()
