"""The buffer's pure core: which finished rollouts the trainer may take, and when.

Items are submitted when their generation starts (fixing their place in the queue) and
completed when it ends. ``release()`` applies the configured rule; every submitted item
leaves exactly once, either released or dropped. No I/O, no locks: the shell adds those.
"""

from __future__ import annotations

import bisect
import copy
import logging
from dataclasses import asdict, dataclass, field
from typing import Any

from rollyard.core.clock import Clock, SystemClock
from rollyard.core.errors import Conflict, DataError, NotFound
from rollyard.rl.buffer.config import BufferConfig, ReleaseRule, StaleAction

log = logging.getLogger(__name__)

STATE_VERSION = 1


@dataclass
class _Entry:
    item_id: str
    index: int
    unit: str
    group_id: str | None
    payload: Any
    policy_version: int
    length: int = 0
    completed: bool = False
    discarded: bool = False
    submitted_at: float = 0.0
    completed_at: float | None = None
    done_seq: int | None = None


@dataclass
class _Unit:
    key: str
    index: int
    size: int
    members: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Released:
    """One item leaving the buffer, with the numbers the trainer and metrics need."""

    item_id: str
    index: int
    group_id: str | None
    payload: Any
    policy_version: int
    length: int
    staleness: int
    weight: float
    submitted_at: float
    completed_at: float | None
    reason: str = "released"  # or "stale", "discarded"


@dataclass(frozen=True)
class Release:
    items: list[Released]
    dropped: list[Released]


class WindowedFifo:
    """Release rules over a queue of rollouts: windowed FIFO, strict FIFO, freshest-first.

    The head is the oldest unit not yet taken; the window is the W unit indices starting at
    the head, holes included, so it moves only when the head leaves. W is fixed the first time
    a release looks at a new head (``window_fraction``: from the live count then) and kept until
    that head leaves, so neither new submissions nor releases behind the head move the window.
    """

    def __init__(self, config: BufferConfig, clock: Clock | None = None) -> None:
        self.config = config
        self._clock: Clock = clock or SystemClock()
        self._entries: dict[str, _Entry] = {}
        self._units: dict[str, _Unit] = {}
        self._order: list[int] = []  # live unit indices, sorted
        self._window: tuple[int, int | None] | None = None  # (head, W) fixed when the head arrived
        self._by_index: dict[int, str] = {}
        self._next_item = 0
        self._next_unit = 0
        self._next_done = 0

    # ---- producers -------------------------------------------------------------------
    def submit(
        self,
        item_id: str,
        *,
        group_id: str | None = None,
        group_size: int | None = None,
        policy_version: int = 0,
        payload: Any = None,
    ) -> int:
        """Queue an item whose generation is starting; returns its submission index."""
        if item_id in self._entries:
            raise Conflict(f"item {item_id!r} is already in the buffer")
        if policy_version < 0:
            raise DataError(f"item {item_id!r}: negative policy version {policy_version}")
        unit = self._unit_for(item_id, group_id, group_size)
        entry = _Entry(
            item_id=item_id,
            index=self._next_item,
            unit=unit.key,
            group_id=group_id,
            payload=payload,
            policy_version=policy_version,
            submitted_at=self._clock.now(),
        )
        self._next_item += 1
        self._entries[item_id] = entry
        unit.members.append(item_id)
        return entry.index

    def _unit_for(self, item_id: str, group_id: str | None, group_size: int | None) -> _Unit:
        if not self.config.group_whole:
            return self._new_unit(item_id, 1)
        if group_id is None:
            raise DataError(f"item {item_id!r}: group_whole release needs a group_id")
        unit = self._units.get(group_id)
        if unit is None:
            if group_size is None or group_size < 1:
                raise DataError(f"group {group_id!r}: the first member must give group_size >= 1")
            return self._new_unit(group_id, group_size)
        if group_size is not None and group_size != unit.size:
            raise Conflict(f"group {group_id!r}: size {group_size} differs from {unit.size}")
        if len(unit.members) >= unit.size:
            raise Conflict(f"group {group_id!r} already has its {unit.size} members")
        return unit

    def _new_unit(self, key: str, size: int) -> _Unit:
        if key in self._units:
            raise Conflict(f"unit {key!r} is already in the buffer")
        unit = _Unit(key=key, index=self._next_unit, size=size)
        self._next_unit += 1
        self._units[key] = unit
        self._by_index[unit.index] = key
        self._order.append(unit.index)  # indices only grow, so the list stays sorted
        return unit

    def complete(
        self,
        item_id: str,
        *,
        policy_version: int | None = None,
        length: int | None = None,
        payload: Any = None,
    ) -> None:
        """Mark an item finished; ``policy_version`` is the oldest version that produced it."""
        entry = self._live_entry(item_id)
        if policy_version is not None:
            if policy_version < 0:
                raise DataError(f"item {item_id!r}: negative policy version {policy_version}")
            entry.policy_version = policy_version
        if length is not None:
            if length < 0:
                raise DataError(f"item {item_id!r}: negative length {length}")
            entry.length = length
        if payload is not None:
            entry.payload = payload
        entry.completed = True
        entry.completed_at = self._clock.now()
        entry.done_seq = self._take_done_seq()

    def discard(self, item_id: str) -> None:
        """Give up on an item (its generation failed); it leaves as dropped, with its group."""
        entry = self._live_entry(item_id)
        entry.discarded = True
        entry.done_seq = self._take_done_seq()

    def _live_entry(self, item_id: str) -> _Entry:
        entry = self._entries.get(item_id)
        if entry is None:
            raise NotFound(f"item {item_id!r} is not in the buffer")
        if entry.completed or entry.discarded:
            raise Conflict(f"item {item_id!r} is already finished")
        return entry

    def _take_done_seq(self) -> int:
        self._next_done += 1
        return self._next_done

    # ---- consumer --------------------------------------------------------------------
    def release(self, trainer_version: int, max_units: int) -> Release:
        """Take up to ``max_units`` units the rule allows, oldest-finished first in the window.

        Stale or discarded units met on the way are dropped and do not count.
        """
        if max_units < 1:
            raise DataError(f"max_units must be >= 1, got {max_units}")
        if trainer_version < 0:
            raise DataError(f"negative trainer version {trainer_version}")
        items: list[Released] = []
        dropped: list[Released] = []
        taken = 0
        while taken < max_units:
            candidates = self._candidates()
            doomed = [u for u in candidates if self._drop_reason(u, trainer_version)]
            if doomed:
                for u in doomed:
                    dropped.extend(self._remove(u, trainer_version, self._drop_reason(u, trainer_version)))
                continue  # the head may have moved
            if not candidates:
                break
            items.extend(self._remove(candidates[0], trainer_version, "released"))
            taken += 1
        if dropped:
            log.info("buffer dropped=%d reasons=%s", len(dropped), sorted({d.reason for d in dropped}))
        return Release(items=items, dropped=dropped)

    def window_bounds(self) -> tuple[int, int | None] | None:
        """(head, last index allowed) in unit indices, None when empty; last None = unbounded.

        For a head no release has looked at yet, the W it would be given now."""
        if not self._order:
            return None
        head = self._order[0]
        fixed = self._window is not None and self._window[0] == head
        w = self._window[1] if fixed else self.config.window_size(len(self._order))  # type: ignore[index]
        return head, (None if w is None else head + w - 1)

    def _fix_window(self) -> None:
        """A release looks at the head: a new head's W is fixed now and kept until it leaves."""
        bounds = self.window_bounds()
        if bounds is not None and (self._window is None or self._window[0] != bounds[0]):
            self._window = (bounds[0], None if bounds[1] is None else bounds[1] - bounds[0] + 1)

    def _candidates(self) -> list[_Unit]:
        self._fix_window()
        bounds = self.window_bounds()
        if bounds is None:
            return []
        _, last = bounds
        stop = len(self._order) if last is None else bisect.bisect_right(self._order, last)
        units = [self._units[self._by_index[i]] for i in self._order[:stop]]
        done = [u for u in units if self._is_done(u)]
        if self.config.rule == ReleaseRule.FRESHEST:
            done.sort(key=lambda u: (-self._unit_version(u), -self._unit_done_seq(u)))
        else:
            done.sort(key=self._unit_done_seq)
        return done

    def _is_done(self, unit: _Unit) -> bool:
        if len(unit.members) < unit.size:
            return False
        return all(self._entries[m].completed or self._entries[m].discarded for m in unit.members)

    def _unit_version(self, unit: _Unit) -> int:
        return min(self._entries[m].policy_version for m in unit.members)

    def _unit_done_seq(self, unit: _Unit) -> int:
        return max(self._entries[m].done_seq or 0 for m in unit.members)

    def _drop_reason(self, unit: _Unit, trainer_version: int) -> str | None:
        if any(self._entries[m].discarded for m in unit.members):
            return "discarded"
        k = self.config.max_staleness
        if k is None or self.config.stale_action != StaleAction.DROP:
            return None
        return "stale" if trainer_version - self._unit_version(unit) > k else None

    def _weight(self, staleness: int) -> float:
        k = self.config.max_staleness
        if k is None or staleness <= k or self.config.stale_action != StaleAction.DOWNWEIGHT:
            return 1.0
        return float(self.config.stale_decay ** (staleness - k))

    def _remove(self, unit: _Unit, trainer_version: int, reason: str | None) -> list[Released]:
        staleness = max(0, trainer_version - self._unit_version(unit))
        weight = 0.0 if reason != "released" else self._weight(staleness)
        out = []
        for m in unit.members:
            e = self._entries.pop(m)
            out.append(
                Released(
                    item_id=e.item_id,
                    index=e.index,
                    group_id=e.group_id,
                    payload=e.payload,
                    policy_version=e.policy_version,
                    length=e.length,
                    staleness=staleness,
                    weight=weight,
                    submitted_at=e.submitted_at,
                    completed_at=e.completed_at,
                    reason=reason or "released",
                )
            )
        del self._units[unit.key]
        del self._by_index[unit.index]
        self._order.pop(bisect.bisect_left(self._order, unit.index))
        return out

    # ---- introspection and checkpoints -----------------------------------------------
    def __len__(self) -> int:
        """Items submitted and not yet released or dropped."""
        return len(self._entries)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly; payloads are deep-copied as they are."""
        return {
            "version": STATE_VERSION,
            "config": self.config.model_dump(mode="json"),
            "next_item": self._next_item,
            "next_unit": self._next_unit,
            "next_done": self._next_done,
            "entries": [asdict(e) for e in sorted(self._entries.values(), key=lambda e: e.index)],
            "units": [asdict(self._units[self._by_index[i]]) for i in self._order],
            "window": None if self._window is None else list(self._window),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this buffer's contents (and config) with a checkpoint's."""
        if state.get("version") != STATE_VERSION:
            raise DataError(f"buffer state version {state.get('version')!r} is not {STATE_VERSION}")
        try:
            config = BufferConfig.model_validate(state["config"])
            entries = {e["item_id"]: _Entry(**copy.deepcopy(e)) for e in state["entries"]}
            units = {u["key"]: _Unit(**copy.deepcopy(u)) for u in state["units"]}
            counters = (int(state["next_item"]), int(state["next_unit"]), int(state["next_done"]))
            window = state.get("window")  # absent in older checkpoints: fixed afresh below
            window = (
                None if window is None else (int(window[0]), None if window[1] is None else int(window[1]))
            )
        except (KeyError, TypeError, ValueError) as e:
            raise DataError(f"malformed buffer state: {e}") from e
        members = sorted(m for u in units.values() for m in u.members)
        if members != sorted(entries) or any(
            entries[m].unit != u.key for u in units.values() for m in u.members
        ):
            raise DataError("malformed buffer state: units and entries disagree")
        self.config = config
        self._entries = entries
        self._units = units
        self._by_index = {u.index: u.key for u in units.values()}
        self._order = sorted(self._by_index)
        self._next_item, self._next_unit, self._next_done = counters
        self._window = window
