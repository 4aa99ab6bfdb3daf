"""One exception hierarchy for the whole project.

Boundaries (CLI, HTTP routes) map these to one-line messages or API error bodies;
nothing below them needs to know which dialect the caller speaks.
"""

from __future__ import annotations


class RollyardError(Exception):
    """Base of every error rollyard raises on purpose."""

    code: str = "rollyard_error"
    http_status: int = 500

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class ConfigError(RollyardError):
    """A config file, flag or model directory is missing or invalid."""

    code = "invalid_config"
    http_status = 400


class DataError(RollyardError):
    """A record (turn, trajectory, sample) breaks its schema's invariants."""

    code = "invalid_data"
    http_status = 400


class InvalidRequest(RollyardError):
    """A client request is malformed or asks for something impossible."""

    code = "invalid_request_error"
    http_status = 400


class ContextLengthExceeded(InvalidRequest):
    """The prompt (plus requested output) does not fit the model's context."""

    code = "context_length_exceeded"


class AuthError(RollyardError):
    """Missing or wrong credentials."""

    code = "invalid_api_key"
    http_status = 401


class Forbidden(RollyardError):
    """Valid credentials, but not for this resource."""

    code = "permission_denied"
    http_status = 403


class NotFound(RollyardError):
    code = "not_found"
    http_status = 404


class Conflict(RollyardError):
    """The resource is in a state that forbids the request (e.g. a finished program)."""

    code = "conflict"
    http_status = 409


class RateLimited(RollyardError):
    """This caller is throttled for a while (e.g. its requests kept failing); retry later."""

    code = "rate_limit_exceeded"
    http_status = 429

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class EngineError(RollyardError):
    """The engine answered with an error we did not expect."""

    code = "engine_error"
    http_status = 502


class EngineUnavailable(EngineError):
    """The engine cannot be reached, died, or is not healthy; retrying later may work."""

    code = "engine_unavailable"
    http_status = 503

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class JournalUnavailable(RollyardError):
    """The journal cannot write (disk full, I/O error): nothing was recorded; retry later."""

    code = "journal_unavailable"
    http_status = 503

    def __init__(self, message: str, *, retry_after_s: float = 5.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class GatewayUnavailable(RollyardError):
    """A gateway process (a shard, or a run's gateway) did not answer, or failed (5xx)."""

    http_status = 503


class EngineStartError(EngineError):
    """A local engine process could not be started or never became healthy."""

    code = "engine_start_failed"


class SandboxError(RollyardError):
    """A sandbox could not be created, or an operation on it failed."""

    code = "sandbox_error"


class AgentFailed(RollyardError):
    """Programs keep ending without one model turn: the agent itself is broken, not the policy."""

    code = "agent_failed"


class WorkerLost(RollyardError):
    """A Ray rollout worker (or its whole node) died under a program: the run stops, to resume."""

    code = "worker_lost"


class TaskError(RollyardError):
    """A task directory is missing fields or its setup failed."""

    code = "invalid_task"
    http_status = 400


class TrainError(RollyardError):
    """A training step could not be completed (NaN, publish refused, ...)."""

    code = "train_error"
