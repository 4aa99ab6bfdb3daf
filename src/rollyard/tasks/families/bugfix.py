"""Family ``bugfix``: a small Python module with one injected bug; hidden pytest tests.

Each instance draws three functions from a fixed catalogue, renames the module, and breaks
one function with one of its known bugs. The golden solution is the unbroken module.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict

from rollyard.tasks.families.base import Step, ToolCall, bash, read_file, submit, with_mistakes, write_file
from rollyard.tasks.model import Task, TaskSpec, Timeouts
from rollyard.tasks.writer import TaskFiles


class FunctionTemplate(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    source: str  # the correct definition
    bugs: tuple[tuple[str, str], ...]  # (correct fragment, buggy fragment)
    tests: str  # pytest functions; ``M`` is the module under test


CATALOGUE = (
    FunctionTemplate(
        name="clamp",
        source="def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n",
        bugs=(("min(x, hi)", "min(x, lo)"), ("max(lo, min(x, hi))", "min(lo, max(x, hi))")),
        tests=(
            "def test_clamp_inside():\n    assert M.clamp(5, 0, 10) == 5\n\n"
            "def test_clamp_above():\n    assert M.clamp(15, 0, 10) == 10\n\n"
            "def test_clamp_below():\n    assert M.clamp(-3, 0, 10) == 0\n"
        ),
    ),
    FunctionTemplate(
        name="mean",
        source="def mean(xs):\n    return sum(xs) / len(xs)\n",
        bugs=(("/ len(xs)", "/ (len(xs) + 1)"), ("/ len(xs)", "// len(xs)")),
        tests=(
            "def test_mean_of_ints():\n    assert M.mean([1, 2, 3, 4]) == 2.5\n\n"
            "def test_mean_of_one():\n    assert M.mean([7]) == 7\n"
        ),
    ),
    FunctionTemplate(
        name="is_palindrome",
        source="def is_palindrome(s):\n    t = s.lower()\n    return t == t[::-1]\n",
        bugs=(("t == t[::-1]", "s == s[::-1]"), ("t[::-1]", "t[1:]")),
        tests=(
            "def test_palindrome_mixed_case():\n    assert M.is_palindrome('Level')\n\n"
            "def test_not_palindrome():\n    assert not M.is_palindrome('rust')\n\n"
            "def test_palindrome_simple():\n    assert M.is_palindrome('abba')\n"
        ),
    ),
    FunctionTemplate(
        name="count_words",
        source="def count_words(text):\n    return len(text.split())\n",
        bugs=(("text.split()", "text.split(' ')"), ("len(text.split())", "len(text.split()) - 1")),
        tests=(
            "def test_count_words_spaces():\n    assert M.count_words('a  b   c') == 3\n\n"
            "def test_count_words_empty():\n    assert M.count_words('') == 0\n\n"
            "def test_count_words_one():\n    assert M.count_words('hi') == 1\n"
        ),
    ),
    FunctionTemplate(
        name="running_max",
        source=(
            "def running_max(xs):\n    out = []\n    cur = None\n    for x in xs:\n"
            "        if cur is None or x > cur:\n            cur = x\n        out.append(cur)\n"
            "    return out\n"
        ),
        bugs=(("x > cur", "x < cur"), ("out.append(cur)", "out.append(x)")),
        tests=(
            "def test_running_max():\n    assert M.running_max([1, 3, 2, 5, 4]) == [1, 3, 3, 5, 5]\n\n"
            "def test_running_max_empty():\n    assert M.running_max([]) == []\n"
        ),
    ),
    FunctionTemplate(
        name="last_n",
        source="def last_n(xs, n):\n    return xs[-n:] if n > 0 else []\n",
        bugs=(("xs[-n:]", "xs[-n + 1:]"), ("n > 0", "n >= 0")),
        tests=(
            "def test_last_two():\n    assert M.last_n([1, 2, 3], 2) == [2, 3]\n\n"
            "def test_last_zero():\n    assert M.last_n([1, 2, 3], 0) == []\n\n"
            "def test_last_one():\n    assert M.last_n([1, 2, 3], 1) == [3]\n"
        ),
    ),
)
MODULES = ("utils", "helpers", "toolkit", "listops", "textops")


def _module(functions: list[FunctionTemplate], broken: str | None = None, bug: int = 0) -> str:
    parts = ['"""Small helpers."""\n']
    for f in functions:
        src = f.source
        if f.name == broken:
            good, bad = f.bugs[bug]
            src = src.replace(good, bad, 1)
        parts.append(src)
    return "\n\n".join(parts)


class BugfixFamily:
    name = "bugfix"
    description = "fix an injected bug in a small Python module so hidden pytest tests pass"

    def __init__(self, functions: int = 3) -> None:
        if not 1 <= functions <= len(CATALOGUE):
            raise ValueError(f"functions must be in 1..{len(CATALOGUE)}")
        self.functions = functions

    def make(self, rng: random.Random, task_id: str) -> TaskFiles:
        funcs = rng.sample(CATALOGUE, self.functions)
        broken = rng.choice(funcs)
        bug = rng.randrange(len(broken.bugs))
        module = rng.choice(MODULES)
        fixed = _module(funcs)
        tests = f"import {module} as M\n\n\n" + "\n\n".join(f.tests for f in funcs)
        spec = TaskSpec(
            id=task_id,
            family=self.name,
            instruction=(
                f"{broken.name}() in {module}.py returns wrong results for some inputs. "
                "Find the bug and fix it without changing the other functions."
            ),
            test_command="python3 -m pytest -q -p no:cacheprovider _hidden_tests",
            timeouts=Timeouts(setup_s=30, agent_s=300, test_s=60),
            metadata={"module": f"{module}.py", "function": broken.name, "bug": list(broken.bugs[bug])},
        )
        return TaskFiles(
            spec=spec,
            workspace={f"{module}.py": _module(funcs, broken.name, bug)},
            tests={f"test_{module}.py": tests},
            solution={f"{module}.py": fixed},
        )

    def solve(self, task: Task, rng: random.Random, mistake_prob: float) -> list[ToolCall]:
        path: str = task.spec.metadata["module"]
        fixed = (task.solution_dir / path).read_text()
        steps = [
            Step(call=read_file(path), detours=[bash("ls"), bash(f"grep -n def {path}")]),
            Step(
                call=write_file(path, fixed),
                detours=[bash(f"python3 -c 'import {path[:-3]}'"), bash(f"wc -l {path}")],
            ),
            Step(call=submit()),
        ]
        return with_mistakes(steps, rng, mistake_prob)
