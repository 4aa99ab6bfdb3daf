"""How a buffer decides what the trainer may take next: order, window, staleness, grouping."""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, model_validator


class ReleaseRule(StrEnum):
    WINDOW = "window"  # Forge's windowed FIFO: any completed unit in [head, head + W - 1]
    FIFO = "fifo"  # strict submission order (a window of one)
    FRESHEST = "freshest"  # newest policy version first, anywhere in the queue


class StaleAction(StrEnum):
    DROP = "drop"
    DOWNWEIGHT = "downweight"


class BufferConfig(BaseModel):
    """Release rule of a buffer.

    ``window`` is W in units; ``window_fraction`` gives W = ceil(f * N) where N is the number
    of live units (submitted and not yet released or dropped) when a release first looks at the
    current head, at least 1; W then stays fixed until that head leaves, so the window moves
    only then (new submissions and releases behind the head change neither end). A *unit* is one
    item, or one whole group when ``group_whole`` is set. A unit whose policy version lags
    the trainer's by more than ``max_staleness`` is dropped, or released with weight
    ``stale_decay ** (lag - max_staleness)``.
    """

    model_config = ConfigDict(extra="forbid")

    rule: ReleaseRule = ReleaseRule.WINDOW
    window: int | None = Field(default=None, ge=1)
    window_fraction: float | None = Field(default=None, gt=0.0, le=1.0)
    max_staleness: int | None = Field(default=None, ge=0)
    stale_action: StaleAction = StaleAction.DROP
    stale_decay: float = Field(default=0.5, gt=0.0, le=1.0)
    group_whole: bool = False

    @model_validator(mode="after")
    def _window(self) -> BufferConfig:
        if self.window is not None and self.window_fraction is not None:
            raise ValueError("give window or window_fraction, not both")
        if self.rule == ReleaseRule.WINDOW and self.window is None and self.window_fraction is None:
            raise ValueError("the window rule needs window or window_fraction")
        return self

    def window_size(self, live_units: int) -> int | None:
        """W for the current queue; None means unbounded (freshest-first)."""
        if self.rule == ReleaseRule.FIFO:
            return 1
        if self.rule == ReleaseRule.FRESHEST:
            return None
        if self.window is not None:
            return self.window
        assert self.window_fraction is not None
        # The small epsilon keeps 0.3 * 10 from rounding up to 4.
        return max(1, math.ceil(self.window_fraction * live_units - 1e-9))
