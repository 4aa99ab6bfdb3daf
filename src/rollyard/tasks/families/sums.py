"""Family ``sums``: N input files, N sub-goals; the hidden test reports the fraction done.

The dense-signal family: each output file written correctly is one sub-goal, so a partial
solution earns a partial ``pass_fraction`` rather than a bare fail.
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

NAMES = ("a", "b", "c", "d", "e", "f", "g", "h")


class SumsFamily:
    name = "sums"
    description = "write the sum of each input file's numbers to outputs/ (one sub-goal per file)"

    def __init__(self, min_files: int = 3, max_files: int = 5) -> None:
        if not 1 <= min_files <= max_files <= len(NAMES):
            raise ValueError(f"need 1 <= min_files <= max_files <= {len(NAMES)}")
        self.min_files = min_files
        self.max_files = max_files

    def make(self, rng: random.Random, task_id: str) -> TaskFiles:
        names = sorted(rng.sample(NAMES, rng.randint(self.min_files, self.max_files)))
        workspace, sums = {}, {}
        for n in names:
            nums = [rng.randint(1, 20) for _ in range(rng.randint(2, 4))]
            workspace[f"inputs/{n}.txt"] = " ".join(map(str, nums)) + "\n"
            sums[n] = str(sum(nums))
        spec = TaskSpec(
            id=task_id,
            family=self.name,
            instruction=(
                "For each file in inputs/, write the sum of its numbers to a file "
                "of the same name in outputs/."
            ),
            test_command="python3 _hidden_tests/check.py",
            timeouts=Timeouts(setup_s=30, agent_s=180, test_s=30),
            metadata={"sums": sums},
        )
        checks = [(f"outputs/{n}.txt", s) for n, s in sums.items()]
        return TaskFiles(
            spec=spec,
            workspace=workspace,
            tests={"check.py": pass_fraction_check(checks)},
            solution={f"outputs/{n}.txt": s + "\n" for n, s in sums.items()},
        )

    def solve(self, task: Task, rng: random.Random, mistake_prob: float) -> list[ToolCall]:
        sums: dict[str, str] = task.spec.metadata["sums"]
        steps = [Step(call=bash("head inputs/*"), detours=[bash("ls"), bash("ls outputs")])]
        for n, s in sums.items():
            wrong = str(int(s) + rng.choice((-2, -1, 1, 2)))
            steps.append(
                Step(
                    call=write_file(f"outputs/{n}.txt", s),
                    detours=[write_file(f"outputs/{n}.txt", wrong), bash(f"cat inputs/{n}.txt")],
                )
            )
        steps.append(Step(call=submit()))
        return with_mistakes(steps, rng, mistake_prob)
