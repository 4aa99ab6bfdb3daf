"""The program table and who may reach what.

Keys are looked up by their SHA-256 (so the lookup itself leaks nothing) and then compared
in constant time. The admin token reaches every endpoint; a program key reaches only the
model endpoints and records of its own program. Keys never appear in logs or listings.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Callable
from pathlib import Path

from rollyard.core.clock import Clock
from rollyard.core.errors import AuthError, Conflict, Forbidden, NotFound
from rollyard.core.ids import keys_equal
from rollyard.core.program import Program, ProgramPhase, ProgramState
from rollyard.core.trajectory import Outcome
from rollyard.gateway.recorder import SqliteJournal

log = logging.getLogger(__name__)

ProgramHook = Callable[[Program], None]


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def resolve_admin_token(token: str | None, state_dir: Path) -> tuple[str, Path | None]:
    """The flag, else ``ROLLYARD_ADMIN_TOKEN``, else a generated token written to a 0600 file."""
    token = token or os.environ.get("ROLLYARD_ADMIN_TOKEN")
    if token:
        return token, None
    path = state_dir / "admin_token"
    state_dir.mkdir(parents=True, exist_ok=True)
    if path.exists():
        return path.read_text().strip(), path
    token = "rya-" + secrets.token_urlsafe(24)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, path


class ProgramTable:
    def __init__(self, journal: SqliteJournal, clock: Clock, admin_token: str) -> None:
        if not admin_token:
            raise AuthError("an admin token is required")
        self.journal = journal
        self.clock = clock
        self._admin = admin_token
        self._programs: dict[str, Program] = {}
        self._by_key: dict[str, str] = {}
        self._hooks: list[ProgramHook] = []
        self._create_hooks: list[ProgramHook] = []
        for p in journal.load_programs():
            self._index(p)

    def _index(self, p: Program) -> None:
        self._programs[p.id] = p
        self._by_key[_digest(p.api_key)] = p.id

    def __len__(self) -> int:
        return len(self._programs)

    def all(self) -> list[Program]:
        return list(self._programs.values())

    def on_terminate(self, hook: ProgramHook) -> None:
        """Called with the program when it finishes or is terminated (the sandbox layer subscribes)."""
        self._hooks.append(hook)

    def on_create(self, hook: ProgramHook) -> None:
        """Called with each new program, and now with every live one (the scheduler subscribes)."""
        self._create_hooks.append(hook)
        for p in self._programs.values():
            if not p.state.is_over:
                hook(p)

    # auth -----------------------------------------------------------------
    def is_admin(self, key: str | None) -> bool:
        return bool(key) and keys_equal(key or "", self._admin)

    def id_for_key(self, key: str) -> str | None:
        """The id of the program whose key this may be, without authenticating it (a hint: the
        request is authenticated as usual before anything is done for it)."""
        return self._by_key.get(_digest(key))

    def require_admin(self, key: str | None) -> None:
        if not key:
            raise AuthError("missing admin token (Authorization: Bearer ... or x-api-key)")
        if not self.is_admin(key):
            raise AuthError("invalid admin token")

    def authenticate(self, key: str | None, program_id: str | None = None, admin_ok: bool = True) -> Program:
        """The program a model request acts for. ``program_id`` comes from a ``/p/{id}/`` URL,
        where the admin token may act for any program unless ``admin_ok`` is False (the
        sandboxes' socket: there only a program's own key is one)."""
        if not key:
            raise AuthError("missing API key (Authorization: Bearer ... or x-api-key)")
        if self.is_admin(key):
            if not admin_ok:
                raise Forbidden("the admin token is not a program key on the gateway's sandbox socket")
            if program_id is not None:
                return self.get(program_id)
        pid = self._by_key.get(_digest(key))
        prog = self._programs.get(pid) if pid else None
        if prog is None or not keys_equal(prog.api_key, key):
            raise AuthError("invalid API key")
        if program_id is not None and program_id != prog.id:
            raise Forbidden("this key belongs to another program")
        return prog

    # lifecycle ------------------------------------------------------------
    def get(self, program_id: str) -> Program:
        p = self._programs.get(program_id)
        if p is None:
            raise NotFound(f"no program {program_id!r}")
        return p

    def create(self, program: Program) -> Program:
        if program.id in self._programs:
            raise Conflict(f"program {program.id!r} already exists")
        if _digest(program.api_key) in self._by_key:
            raise Conflict("that API key is already in use")
        program.created_at = self.clock.now()
        self.journal.save_program(program)
        self._index(program)
        log.info("program created id=%s group=%s task=%s", program.id, program.group_id, program.task_id)
        for hook in self._create_hooks:
            hook(program)
        return program

    def require_active(self, program: Program) -> None:
        if program.state.is_over:
            raise Conflict(f"program {program.id} is {program.state.value}; it accepts no more requests")

    def set_phase(self, program: Program, phase: ProgramPhase) -> None:
        program.phase = phase

    def finish(
        self, program_id: str, state: ProgramState, status: str | None, outcome: Outcome | None = None
    ) -> Program:
        if not state.is_over:
            raise Conflict(f"finish needs state finished or terminated, not {state.value}")
        p = self.get(program_id)
        if p.state.is_over:
            raise Conflict(f"program {p.id} is already {p.state.value}")
        p.state, p.status, p.finished_at = state, status, self.clock.now()
        p.phase = ProgramPhase.ACTING
        self.journal.save_program(p, outcome or Outcome(status=status or state.value))
        log.info("program ended id=%s state=%s status=%s", p.id, state.value, status)
        for hook in self._hooks:
            try:
                hook(p)
            except Exception:  # a subscriber's bug must not undo the finish
                log.exception("termination hook failed program=%s", p.id)
        return p
