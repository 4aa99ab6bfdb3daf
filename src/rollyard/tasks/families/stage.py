"""Family ``stage``: advance the stage in stage.txt one step along a fixed cycle.

The workspace holds ``stage.txt`` and a helper, ``advance.sh``, that advances it; the cycle
(``alpha -> beta -> gamma -> delta -> alpha``) is not in the instruction. The scripted solver
runs the helper; its mistake (``mistake_prob``) is the shortcut RL should unlearn: writing a
stage straight into the file without looking, right one time in ``len(cycle)``.

Built for the default example's ~4M-parameter model trained from scratch for minutes on a
CPU, which learns procedures but not, in that time, to copy or map a token it read in a tool
output (measured in docs/training.md): solving needs no token from an observation, and a warm
start on demonstrations with ``mistake_prob`` 0.5 (the demo's) imitates a policy that guesses
half the time.
"""

from __future__ import annotations

import random

from rollyard.tasks.families.base import (
    ToolCall,
    bash,
    check_mistake_prob,
    pass_fraction_check,
    submit,
    write_file,
)
from rollyard.tasks.model import Task, TaskSpec, Timeouts
from rollyard.tasks.writer import TaskFiles

CYCLE = ("alpha", "beta", "gamma", "delta")
FILE = "stage.txt"
HELPER = "advance.sh"


def next_stage(stage: str, cycle: tuple[str, ...] = CYCLE) -> str:
    return cycle[(cycle.index(stage) + 1) % len(cycle)]


class StageFamily:
    name = "stage"
    description = "advance the stage in stage.txt one step along a fixed cycle (a workspace helper does it)"

    def __init__(self, cycle: tuple[str, ...] = CYCLE) -> None:
        if len(cycle) < 2 or len(set(cycle)) != len(cycle):
            raise ValueError("the cycle needs at least two distinct stages")
        self.cycle = cycle

    def make(self, rng: random.Random, task_id: str) -> TaskFiles:
        current = rng.choice(self.cycle)
        target = next_stage(current, self.cycle)
        spec = TaskSpec(
            id=task_id,
            family=self.name,
            instruction=f"Advance the stage in {FILE} to the next one.",
            test_command="python3 _hidden_tests/check.py",
            timeouts=Timeouts(setup_s=30, agent_s=120, test_s=30),
            metadata={"current": current, "target": target, "cycle": list(self.cycle)},
        )
        return TaskFiles(
            spec=spec,
            workspace={FILE: current + "\n", HELPER: helper_script(self.cycle)},
            tests={"check.py": pass_fraction_check([(FILE, target)])},
            solution={FILE: target + "\n"},
        )

    def solve(self, task: Task, rng: random.Random, mistake_prob: float) -> list[ToolCall]:
        """Run the helper and submit; with ``mistake_prob``, write a guess unseen instead."""
        if rng.random() < check_mistake_prob(mistake_prob):
            guess = rng.choice(task.spec.metadata.get("cycle", self.cycle))
            return [write_file(FILE, guess, mistake=guess != task.spec.metadata["target"]), submit()]
        return [bash(f"sh {HELPER}"), submit()]


def helper_script(cycle: tuple[str, ...]) -> str:
    """POSIX sh that moves stage.txt one step along ``cycle`` and prints the new stage."""
    arms = " ".join(f"{a}) n={next_stage(a, cycle)};;" for a in cycle)
    return (
        f"# advance.sh: move {FILE} one step along {' -> '.join((*cycle, cycle[0]))}\n"
        f'case "$(cat {FILE})" in {arms} *) echo "unknown stage" >&2; exit 1;; esac\n'
        f'echo "$n" > {FILE}\n'
        'echo "stage: $n"\n'
    )
