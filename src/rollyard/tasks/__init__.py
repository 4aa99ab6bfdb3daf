"""Tasks: the on-disk format, shipped families (seeded generators + scripted solvers), and
validation and evaluation in sandboxes (hidden tests only ever in a fresh one)."""

from rollyard.tasks.evaluate import FinalState, evaluate, outcome_from, pass_fraction
from rollyard.tasks.families import (
    FAMILIES,
    PASS_FRACTION_MARK,
    Family,
    ToolCall,
    generate,
    get_family,
    solve,
)
from rollyard.tasks.judges import JudgeConfig, JudgePanel, JudgeVote, PanelVerdict
from rollyard.tasks.loader import load_spec, load_task, load_tasks, task_dirs
from rollyard.tasks.model import SolutionKind, Task, TaskSpec, Timeouts, Variant
from rollyard.tasks.sandboxing import apply_solution, prepare, remove_artefacts, sandbox_spec
from rollyard.tasks.validate import TaskVerdict, ValidationReport, validate_task, validate_tasks
from rollyard.tasks.writer import TaskFiles, write_task

__all__ = [
    "FAMILIES",
    "PASS_FRACTION_MARK",
    "Family",
    "FinalState",
    "JudgeConfig",
    "JudgePanel",
    "JudgeVote",
    "PanelVerdict",
    "SolutionKind",
    "Task",
    "TaskFiles",
    "TaskSpec",
    "TaskVerdict",
    "Timeouts",
    "ToolCall",
    "ValidationReport",
    "Variant",
    "apply_solution",
    "evaluate",
    "generate",
    "get_family",
    "load_spec",
    "load_task",
    "load_tasks",
    "outcome_from",
    "pass_fraction",
    "prepare",
    "remove_artefacts",
    "sandbox_spec",
    "solve",
    "task_dirs",
    "validate_task",
    "validate_tasks",
    "write_task",
]
