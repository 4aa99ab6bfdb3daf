"""Property tests: random streams of submit / complete / discard / release / version bumps.

A small model tracks what the buffer should hold; each release is checked against the rule
(window, FIFO order, freshest-first, staleness, whole groups) and the stream is drained at the
end to prove nothing was lost or duplicated. A checkpoint taken mid-stream must replay the
same future exactly.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from rollyard.core import FakeClock
from rollyard.rl.buffer import BufferConfig, ReleaseRule, StaleAction, WindowedFifo

OPS = st.lists(
    st.tuples(
        st.sampled_from(
            ["submit", "submit", "complete", "complete", "discard", "release", "release", "bump", "bump"]
        ),
        st.integers(0, 10_000),
    ),
    max_size=80,
)


@st.composite
def configs(draw: st.DrawFn) -> BufferConfig:
    rule = draw(st.sampled_from(list(ReleaseRule)))
    window: int | None = None
    fraction: float | None = None
    if rule == ReleaseRule.WINDOW:
        if draw(st.booleans()):
            window = draw(st.integers(1, 6))
        else:
            fraction = draw(st.floats(0.05, 1.0))
    return BufferConfig(
        rule=rule,
        window=window,
        window_fraction=fraction,
        max_staleness=draw(st.one_of(st.none(), st.integers(0, 3))),
        stale_action=draw(st.sampled_from(list(StaleAction))),
        stale_decay=draw(st.sampled_from([0.5, 0.9, 1.0])),
        group_whole=draw(st.booleans()),
    )


CONFIGS = configs()


@dataclass
class Model:
    """What the test believes: live units by index, their members and state."""

    cfg: BufferConfig
    version: int = 0
    next_unit: int = 0
    units: dict[int, list[str]] = field(default_factory=dict)  # live unit index -> item ids
    unit_of: dict[str, int] = field(default_factory=dict)
    pending: list[str] = field(default_factory=list)
    done: set[str] = field(default_factory=set)
    discarded: set[str] = field(default_factory=set)
    versions: dict[str, int] = field(default_factory=dict)
    submitted: list[str] = field(default_factory=list)
    out: list[str] = field(default_factory=list)  # released or dropped, in order
    released_units: list[int] = field(default_factory=list)
    window: tuple[int, int | None] | None = None  # (head, W) fixed by the release that first saw the head

    def unit_done(self, u: int) -> bool:
        return all(m in self.done or m in self.discarded for m in self.units[u])

    def unit_version(self, u: int) -> int:
        return min(self.versions[m] for m in self.units[u])


def _submit(buf: WindowedFifo, m: Model, arg: int) -> None:
    size = 1 + arg % 3 if m.cfg.group_whole else 1
    gid = f"g{m.next_unit}"
    members = [f"{gid}-{k}" for k in range(size)]
    for item in members:
        buf.submit(item, group_id=gid, group_size=size, policy_version=m.version, payload=item)
        m.versions[item] = m.version
        m.unit_of[item] = m.next_unit
        m.pending.append(item)
        m.submitted.append(item)
    m.units[m.next_unit] = members
    m.next_unit += 1


def _finish(buf: WindowedFifo, m: Model, arg: int, discard: bool) -> None:
    if not m.pending:
        return
    item = m.pending.pop(arg % len(m.pending))
    if discard:
        buf.discard(item)
        m.discarded.add(item)
        return
    # the oldest turn may come from any version between submission and now
    v = m.versions[item] + arg % (m.version - m.versions[item] + 1)
    buf.complete(item, policy_version=v, length=arg % 50)
    m.versions[item] = v
    m.done.add(item)


def _release_one(buf: WindowedFifo, m: Model) -> None:
    """Release at most one unit and check it against the rule."""
    cfg = m.cfg
    out = buf.release(m.version, 1)
    for d in out.dropped:
        u = m.unit_of[d.item_id]
        assert m.unit_done(u)
        if d.reason == "stale":
            assert cfg.stale_action == StaleAction.DROP and cfg.max_staleness is not None
            assert m.version - m.unit_version(u) > cfg.max_staleness
        else:
            assert d.reason == "discarded" and any(x in m.discarded for x in m.units[u])
    dropped_units = {m.unit_of[d.item_id] for d in out.dropped}
    for u in dropped_units:
        assert sorted(d.item_id for d in out.dropped if m.unit_of[d.item_id] == u) == sorted(m.units[u])
    # drops happen before the single pick, so the pick sees the queue without them
    live = sorted(set(m.units) - dropped_units)
    ready = [u for u in live if m.unit_done(u) and not any(x in m.discarded for x in m.units[u])]
    if cfg.max_staleness is not None and cfg.stale_action == StaleAction.DROP:
        ready = [u for u in ready if m.version - m.unit_version(u) <= cfg.max_staleness]
    if live and m.window is not None and m.window[0] == live[0]:
        w_lo = w_hi = m.window[1]  # fixed by an earlier release, kept while the head stays
    elif not dropped_units:
        w_lo = w_hi = cfg.window_size(len(live))  # fixed now, from the live count
    else:  # fixed during the drops, at a live count between these two
        w_lo, w_hi = cfg.window_size(len(live)), cfg.window_size(len(live) + len(dropped_units))
    allowed = [u for u in ready if w_hi is None or u <= live[0] + w_hi - 1]
    surely = [u for u in ready if w_lo is None or u <= live[0] + w_lo - 1]
    picked = sorted({m.unit_of[r.item_id] for r in out.items})
    assert len(picked) <= 1
    if not picked:
        assert surely == []  # never blocked while something is allowed
    else:
        u = picked[0]
        assert u in allowed  # the window (or FIFO head) is never violated
        assert sorted(r.item_id for r in out.items) == sorted(m.units[u])  # whole unit
        if cfg.rule == ReleaseRule.FIFO:
            assert u == live[0]
        if cfg.rule == ReleaseRule.FRESHEST:
            assert m.unit_version(u) == max(m.unit_version(x) for x in allowed)
        lag = m.version - m.unit_version(u)
        k = cfg.max_staleness
        for r in out.items:
            assert r.staleness == lag
            if k is not None and lag > k:
                assert cfg.stale_action == StaleAction.DOWNWEIGHT
                assert r.weight == cfg.stale_decay ** (lag - k)
            else:
                assert r.weight == 1.0
        m.released_units.append(u)
    for u in dropped_units | set(picked):
        m.out.extend(m.units.pop(u))
    head_after = buf.window_bounds()
    if m.units:
        # the head moves only when the old head left
        assert head_after is not None and head_after[0] == min(m.units)
        if picked and picked[0] == live[0]:
            m.window = None  # the head left; no release has looked at the new one yet
        elif live:  # this release fixed (or kept) the head's W
            w = None if head_after[1] is None else head_after[1] - head_after[0] + 1
            assert w is None or (w_lo is not None and w_hi is not None and w_lo <= w <= w_hi)
            assert m.window is None or m.window[0] != live[0] or m.window[1] == w  # never moved
            m.window = (head_after[0], w)
    else:
        m.window = None


def _run(buf: WindowedFifo, m: Model, ops: list[tuple[str, int]]) -> None:
    for op, arg in ops:
        if m.window is not None:  # nothing but the head leaving moves a fixed window
            w = m.window[1]
            assert buf.window_bounds() == (m.window[0], None if w is None else m.window[0] + w - 1)
        if op == "submit":
            _submit(buf, m, arg)
        elif op in ("complete", "discard"):
            _finish(buf, m, arg, discard=op == "discard")
        elif op == "release":
            _release_one(buf, m)
        else:
            m.version += 1


def _drain(buf: WindowedFifo, m: Model) -> None:
    while m.pending:
        _finish(buf, m, 0, discard=False)
    for _ in range(len(m.units) + 1):
        _release_one(buf, m)


@settings(max_examples=150, deadline=None)
@given(cfg=CONFIGS, ops=OPS)
def test_every_release_obeys_its_rule_and_nothing_is_lost_or_duplicated(
    cfg: BufferConfig, ops: list[tuple[str, int]]
) -> None:
    buf = WindowedFifo(cfg)
    m = Model(cfg)
    _run(buf, m, ops)
    _drain(buf, m)
    assert len(buf) == 0 and not m.units
    assert sorted(m.out) == sorted(m.submitted)
    assert len(set(m.out)) == len(m.out)
    if cfg.rule == ReleaseRule.FIFO:
        assert m.released_units == sorted(m.released_units)


@settings(max_examples=100, deadline=None)
@given(cfg=CONFIGS, before=OPS, after=OPS)
def test_a_checkpoint_taken_mid_stream_replays_the_same_future(
    cfg: BufferConfig, before: list[tuple[str, int]], after: list[tuple[str, int]]
) -> None:
    clock = FakeClock()  # shared, so timestamps match
    buf = WindowedFifo(cfg, clock)
    _run(buf, Model(cfg), before)
    restored = WindowedFifo(BufferConfig(rule=ReleaseRule.FIFO), clock)
    restored.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert restored.state_dict() == buf.state_dict()
    # replay identical operations on both: every release must match exactly
    for n, (op, arg) in enumerate(after):
        results = []
        for b in (buf, restored):
            if op == "release":
                results.append(b.release(arg % 4, 1 + arg % 3))
            elif op == "submit":
                b.submit(f"new{n}", group_id=f"newg{n}", group_size=1)
            elif op in ("complete", "discard") and len(b):
                pending = [
                    e["item_id"]
                    for e in b.state_dict()["entries"]
                    if not e["completed"] and not e["discarded"]
                ]
                if pending:
                    target = pending[arg % len(pending)]
                    if op == "complete":
                        b.complete(target)
                    else:
                        b.discard(target)
        assert results[:1] == results[1:] or not results
    assert restored.state_dict() == buf.state_dict()
