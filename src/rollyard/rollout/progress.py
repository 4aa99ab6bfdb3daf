"""Live progress for a terminal: step, rollouts in flight, reward, success, tok/s, staleness, ETA."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table


class LiveProgress:
    """A one-row ``rich`` table refreshed on every loop event; a no-op when not on a terminal."""

    def __init__(self, total_steps: int, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.total = total_steps
        self.t0 = time.monotonic()
        self.first_step: int | None = None
        self.state: dict[str, Any] = {"step": 0, "in_flight": 0}
        self._live = Live(self._table(), console=self.console, refresh_per_second=2, transient=False)

    def __enter__(self) -> LiveProgress:
        if self.console.is_terminal:
            self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.console.is_terminal:
            self._live.__exit__(None, None, None)

    def __call__(self, row: dict[str, Any]) -> None:
        if row.get("event") == "phase":  # before the loop: say what the first minutes are spent on
            self.console.print(f"rollyard: {row['phase']}: {row.get('detail', '')}")
            return
        if row.get("event") == "group":
            self.state["in_flight"] = row.get("in_flight", 0)
        else:
            if self.first_step is None:
                self.first_step, self.t0 = int(row.get("step", 0)), time.monotonic()
            self.state.update({k: v for k, v in row.items() if not isinstance(v, list)})
        if self.console.is_terminal:
            self._live.update(self._table())
        elif "event" not in row:
            self.console.print(self._line())

    def _eta(self) -> str:
        done = int(self.state.get("step", 0)) - (self.first_step or 0)
        if done <= 0:
            return "-"
        left = (time.monotonic() - self.t0) / done * (self.total - int(self.state["step"]))
        return f"{left / 60:.1f} min"

    def _cells(self) -> list[tuple[str, str]]:
        s = self.state

        def f(key: str, fmt: str) -> str:
            v = s.get(key)
            return "-" if v is None else format(v, fmt)

        return [
            ("step", f"{s.get('step', 0)}/{self.total}"),
            ("in flight", str(s.get("in_flight", 0))),
            ("reward", f("reward_mean", ".3f")),
            ("success", f("success_rate", ".2f")),
            ("held-out", f("eval_success", ".2f")),
            ("tok/s", f("tokens_per_s", ".0f")),
            ("staleness", f("staleness", ".2f")),
            ("ETA", self._eta()),
        ]

    def _table(self) -> Table:
        table = Table(title="rollyard train", expand=False)
        cells = self._cells()
        for name, _ in cells:
            table.add_column(name, justify="right")
        table.add_row(*(v for _, v in cells))
        return table

    def _line(self) -> str:
        return " ".join(f"{k}={v}" for k, v in self._cells())
