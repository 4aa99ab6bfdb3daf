"""Data model, ids, clocks and errors: the vocabulary every other package speaks. No I/O
beyond the table helpers' atomic file writes."""

from rollyard.core.clock import Clock, FakeClock, SystemClock
from rollyard.core.errors import (
    AuthError,
    ConfigError,
    Conflict,
    ContextLengthExceeded,
    DataError,
    EngineError,
    EngineStartError,
    EngineUnavailable,
    Forbidden,
    InvalidRequest,
    NotFound,
    RollyardError,
    SandboxError,
    TaskError,
    TrainError,
)
from rollyard.core.ids import keys_equal, new_id, new_key
from rollyard.core.program import Program, ProgramPhase, ProgramState, SamplingPolicy
from rollyard.core.sample import Sample
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import (
    SCHEMA_VERSION,
    Event,
    EventKind,
    FinishReason,
    Group,
    Outcome,
    Segment,
    Trajectory,
    Turn,
    TurnTimings,
    extends,
)

__all__ = [
    "SCHEMA_VERSION",
    "AuthError",
    "Clock",
    "ConfigError",
    "Conflict",
    "ContextLengthExceeded",
    "DataError",
    "EngineError",
    "EngineStartError",
    "EngineUnavailable",
    "Event",
    "EventKind",
    "FakeClock",
    "FinishReason",
    "Forbidden",
    "Group",
    "InvalidRequest",
    "NotFound",
    "Outcome",
    "Program",
    "ProgramPhase",
    "ProgramState",
    "RollyardError",
    "Sample",
    "SamplingParams",
    "SamplingPolicy",
    "SandboxError",
    "Segment",
    "SystemClock",
    "TaskError",
    "TrainError",
    "Trajectory",
    "Turn",
    "TurnTimings",
    "extends",
    "keys_equal",
    "new_id",
    "new_key",
]
