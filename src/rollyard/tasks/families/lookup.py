"""Family ``lookup``: find KEY's value in data/ and write it to answer.txt.

Built for a ~4M-parameter model trained for minutes on a CPU: a short formulaic instruction,
a small vocabulary of keys and numeric values, short tool outputs, and a three-call solution
(grep, write, submit).
"""

from __future__ import annotations

import random

from rollyard.tasks.families.base import (
    Step,
    ToolCall,
    bash,
    pass_fraction_check,
    submit,
    with_mistakes,
    write_file,
)
from rollyard.tasks.model import Task, TaskSpec, Timeouts
from rollyard.tasks.writer import TaskFiles

KEYS = (
    "apple", "amber", "birch", "cedar", "coral", "delta", "ember", "flint",
    "grape", "hazel", "iris", "jade", "lemon", "maple", "olive", "pearl",
)  # fmt: skip
ANSWER = "answer.txt"


class LookupFamily:
    name = "lookup"
    description = "find a key's value among a few data files and write it to answer.txt"

    def __init__(self, files: int = 3, keys_per_file: int = 2) -> None:
        if files < 1 or keys_per_file < 1 or files * keys_per_file > len(KEYS):
            raise ValueError(f"files*keys_per_file must be in 1..{len(KEYS)}")
        self.files = files
        self.keys_per_file = keys_per_file

    def make(self, rng: random.Random, task_id: str) -> TaskFiles:
        keys = rng.sample(KEYS, self.files * self.keys_per_file)
        values = {k: str(rng.randint(10, 99)) for k in keys}
        target = rng.choice(keys)
        workspace = {}
        for i in range(self.files):
            chunk = keys[i * self.keys_per_file : (i + 1) * self.keys_per_file]
            workspace[f"data/f{i}.txt"] = "".join(f"{k}={values[k]}\n" for k in chunk)
        spec = TaskSpec(
            id=task_id,
            family=self.name,
            instruction=f"Find the value of {target} in data/ and write it to {ANSWER}.",
            test_command="python3 _hidden_tests/check.py",
            timeouts=Timeouts(setup_s=30, agent_s=120, test_s=30),
            metadata={"key": target, "value": values[target], "keys": keys},
        )
        return TaskFiles(
            spec=spec,
            workspace=workspace,
            tests={"check.py": pass_fraction_check([(ANSWER, values[target])])},
            solution={ANSWER: values[target] + "\n"},
        )

    def solve(self, task: Task, rng: random.Random, mistake_prob: float) -> list[ToolCall]:
        key, value = task.spec.metadata["key"], task.spec.metadata["value"]
        others = [k for k in task.spec.metadata.get("keys", KEYS) if k != key] or [key]
        wrong = str((int(value) + rng.randint(1, 80)) % 90 + 10)
        steps = [
            Step(
                call=bash(f"grep -r {key} data"),
                detours=[bash("ls data"), bash(f"grep -r {rng.choice(others)} data")],
            ),
            Step(call=write_file(ANSWER, value), detours=[write_file(ANSWER, wrong)]),
            Step(call=submit()),
        ]
        return with_mistakes(steps, rng, mistake_prob)
