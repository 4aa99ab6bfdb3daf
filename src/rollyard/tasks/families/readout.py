"""Family ``readout``: ``lookup``'s tasks, solved by a scripted agent that sometimes guesses.

The answer (a two-digit value) is only in a data file, so an episode succeeds only when the
agent reads it (``grep``) and copies it from the tool output into ``answer.txt``. The solver's
mistake (``mistake_prob``) is the shortcut RL should unlearn: writing a plausible value without
looking, right about one time in 90. A warm start on these demonstrations imitates an agent that
guesses ``mistake_prob`` of the time; RL can only raise success by reading more often, so the gain
measures an agent learning to use what it observed (the pretrained-model demo,
``configs/demo-smollm2.yaml``). The tiny demo model cannot copy a token it read, so it is not for it.
"""

from __future__ import annotations

import random

from rollyard.tasks.families.base import ToolCall, bash, check_mistake_prob, submit, write_file
from rollyard.tasks.families.lookup import ANSWER, LookupFamily
from rollyard.tasks.model import Task


class ReadoutFamily(LookupFamily):
    name = "readout"
    description = "lookup's tasks; the scripted solver's mistake is guessing the value without reading"

    def solve(self, task: Task, rng: random.Random, mistake_prob: float) -> list[ToolCall]:
        """grep, write what it printed, submit; with ``mistake_prob``, write a guess unseen instead."""
        key, value = task.spec.metadata["key"], task.spec.metadata["value"]
        if rng.random() < check_mistake_prob(mistake_prob):
            guess = str(rng.randint(10, 99))
            return [write_file(ANSWER, guess, mistake=guess != value), submit()]
        return [bash(f"grep -r {key} data"), write_file(ANSWER, value), submit()]
