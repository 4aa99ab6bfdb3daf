"""Policies by name: presets (``fifo``, ...) and the parts they are built from.

``make_policy("thunder")`` gives a preset; ``make_policy("thunder", order="seer")`` swaps one
part, which is how mechanisms compose (ThunderAgent pause/restore with Seer's ordering and
cost-aware routing in one scheduler). Every name a user can write is listed in the error
for one that does not exist. ``policy_from_spec("rollyard,max_hold_s=20,order=seer")`` is
the same from one string (``rollyard gateway --policy``, ``rollyard sim -p``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.sched.fifo import AdmitAll, FifoOrder, LeastLoaded
from rollyard.sched.kv import KvBudget
from rollyard.sched.policy import Admission, Order, Policy, Router
from rollyard.sched.pool import RebuildCost
from rollyard.sched.rollyard import AgingAdmission, CostAware
from rollyard.sched.seer import GroupBound, SeerOrder, SeerRouter
from rollyard.sched.thunder import FewestTokens, ThunderAdmission

__all__ = [
    "admission_names",
    "make_policy",
    "order_names",
    "policy_from_spec",
    "policy_names",
    "router_names",
]

Options = dict[str, Any]


def _budget(o: Options) -> KvBudget:
    return KvBudget(
        int(o.get("buffer_tokens", 256)), float(o.get("acting_half_life_s", 0.0)), int(o.get("kv_tokens", 0))
    )


def _rebuild(o: Options) -> RebuildCost:
    return RebuildCost(float(o.get("prefill_tok_s", 2000.0)), float(o.get("pool_load_tok_s", 0.0)))


def _thunder(o: Options) -> Admission:
    return ThunderAdmission(
        _budget(o),
        float(o.get("max_hold_s", 1800.0)),
        float(o.get("acting_half_life_s", 0.0)) > 0,
        _rebuild(o),
    )


def _aging(o: Options) -> Admission:
    reserve = o.get("reserve_after_s")
    return AgingAdmission(
        _budget(o),
        max_hold_s=float(o.get("max_hold_s", 30.0)),
        age_s=float(o.get("age_s", 2.0)),
        reserve_after_s=None if reserve is None else float(reserve),
        min_run_s=float(o.get("min_run_s", 5.0)),
        reserve_after_turns=float(o.get("reserve_after_turns", 1.0)),
        min_run_turns=float(o.get("min_run_turns", 2.0)),
        acting_decay=float(o.get("acting_half_life_s", 0.0)) > 0,
        rebuild=_rebuild(o),
    )


ROUTERS: dict[str, Callable[[Options], Router]] = {
    "least_loaded": lambda o: LeastLoaded(),
    "fewest_tokens": lambda o: FewestTokens(_budget(o)),
    "cost_aware": lambda o: CostAware(_budget(o), float(o.get("move_margin", 1.0)), _rebuild(o)),
    "seer": lambda o: SeerRouter(
        max_move_s=float(o.get("max_move_s", 2.0)),
        prefill_tok_s=float(o.get("prefill_tok_s", 2000.0)),
        balance=int(o.get("balance", 2)),
        pool_load_tok_s=float(o.get("pool_load_tok_s", 0.0)),
    ),
    "group_bound": lambda o: GroupBound(),
}
ADMISSIONS: dict[str, Callable[[Options], Admission]] = {
    "admit_all": lambda o: AdmitAll(),
    "thunder": _thunder,
    "aging": _aging,
}
ORDERS: dict[str, Callable[[Options], Order]] = {
    "fifo": lambda o: FifoOrder(),
    "seer": lambda o: SeerOrder(starve_s=float(o.get("starve_s", 30.0))),
}
ON_RELEASE = {"aging"}  # admission policies that also run their restore half when KV is freed
# preset name -> (router, admission, order, default tick seconds)
PRESETS: dict[str, tuple[str, str, str, float | None]] = {
    "fifo": ("least_loaded", "admit_all", "fifo", None),
    "thunder": ("fewest_tokens", "thunder", "fifo", 5.0),
    "rollyard": ("cost_aware", "aging", "fifo", 1.0),
    "seer": ("seer", "admit_all", "seer", None),
    "group_bound": ("group_bound", "admit_all", "fifo", None),
}
KNOWN_OPTIONS = {
    "buffer_tokens",
    "kv_tokens",
    "acting_half_life_s",
    "max_hold_s",
    "age_s",
    "reserve_after_s",
    "min_run_s",
    "reserve_after_turns",
    "min_run_turns",
    "move_margin",
    "max_move_s",
    "prefill_tok_s",
    "starve_s",
    "balance",
    "pool_load_tok_s",
}


def policy_names() -> list[str]:
    return sorted(PRESETS)


def router_names() -> list[str]:
    return sorted(ROUTERS)


def admission_names() -> list[str]:
    return sorted(ADMISSIONS)


def order_names() -> list[str]:
    return sorted(ORDERS)


def _pick(kind: str, table: dict[str, Callable[[Options], Any]], name: str, options: Options) -> Any:
    if name not in table:
        raise ConfigError(f"unknown {kind} {name!r}; choose one of: {', '.join(sorted(table))}")
    try:
        return table[name](options)
    except (TypeError, ValueError) as e:  # a bad option value, named with its part
        raise ConfigError(f"{kind} {name!r}: {e}") from None


def make_policy(
    name: str = "fifo",
    *,
    router: str | None = None,
    admission: str | None = None,
    order: str | None = None,
    tick_s: float | None = None,
    **options: Any,
) -> Policy:
    """A preset, with any of its three parts replaced by name; ``options`` go to every part."""
    if name not in PRESETS:
        raise ConfigError(f"unknown scheduling policy {name!r}; choose one of: {', '.join(policy_names())}")
    unknown = sorted(set(options) - KNOWN_OPTIONS)
    if unknown:
        raise ConfigError(
            f"unknown scheduling option(s) {unknown}; known: {', '.join(sorted(KNOWN_OPTIONS))}"
        )
    r, a, o, t = PRESETS[name]
    r, a, o = router or r, admission or a, order or o
    parts = (
        _pick("router", ROUTERS, r, options),
        _pick("admission policy", ADMISSIONS, a, options),
        _pick("order", ORDERS, o, options),
    )
    label = name if (r, a, o) == PRESETS[name][:3] else f"{name}[{r},{a},{o}]"
    # aging restores as soon as KV is released; thunder keeps ThunderAgent's periodic tick only
    return Policy(label, *parts, tick_s=tick_s if tick_s is not None else t, on_release=a in ON_RELEASE)


def policy_from_spec(spec: str, **defaults: Any) -> Policy:
    """``NAME`` or ``NAME,key=value,...``: keys are ``router``, ``admission``, ``order``,
    ``tick_s`` or an option (``max_hold_s=20``); a bad key or value is a ConfigError.
    ``defaults``: options the spec may override (``rollyard sim --kv-pool``'s ``pool_load_tok_s``)."""
    name, *parts = [s.strip() for s in spec.split(",") if s.strip()] or [""]
    kw: dict[str, Any] = dict(defaults)
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"policy {spec!r}: {part!r} is not key=value")
        kw[key.strip()] = value.strip()
    tick = kw.pop("tick_s", None)
    try:
        tick_s = None if tick is None else float(tick)
    except ValueError:
        raise ConfigError(f"policy {spec!r}: tick_s={tick!r} is not a number") from None
    return make_policy(name, tick_s=tick_s, **kw)
