"""What bounds a run: the gateway shards it needs, and what publication and training leave.

``sized`` finds the shards a run needs: the count whose cores its gateway work keeps at most
70% busy (``costs.shards_needed``: the gateway's CPU seconds over 0.7 x cores x makespan) when
the engines, not the gateway, set the pace (the run within 5% of one whose gateway never
queues).

``bounds`` does that for a fixed number of GPUs per profile (engines = GPUs / tensor
parallelism) and policy, once per publish mode, and says which part bounds the run: the
trainer when it is idle less than ``TRAINER_BOUND`` of the run (rollouts wait for it), else the
engines (the trainer waits for rollouts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollyard.core.errors import ConfigError
from rollyard.sched.registry import policy_from_spec
from rollyard.sim.loop import Simulation
from rollyard.sim.profile import EngineProfile
from rollyard.sim.result import SimResult
from rollyard.sim.workload import Workload

__all__ = ["TRAINER_BOUND", "Bound", "bounds", "sized", "table"]

TRAINER_BOUND = 0.10  # trainer idle below this share of the run: the trainer bounds it
WIDE = 1024  # shards enough that no request waits for a gateway core
SLOWER = 0.05  # a run this much longer than with WIDE shards was paced by its gateway


def sized(w: Workload, spec: str, profile: EngineProfile, rounds: int = 8) -> tuple[SimResult, int]:
    """(the run at the shards it needs, that count): the fewest shards whose cores are <= 70%
    busy when the engines set the pace. First a run with ``WIDE`` shards (the gateway never
    queues) gives the gateway's CPU seconds and the engines' makespan; then runs at the count
    that work asks for, one more shard while a run asks for more or ends more than ``SLOWER``
    after the wide run (the gateway, not the engines, set its pace).

    Why not the count one run at the profile's shards asks for: a gateway that queues does not
    only stretch the run, it changes it (requests reach the scheduler spread out in time, so
    a router that reads polled engine stats places many new programs on one engine between two
    polls), and a longer makespan makes any gateway look less busy."""
    if profile.gateway is None:
        raise ConfigError(f"profile {profile.name} has no gateway cost (--gateway-cost FILE)")
    wide = Simulation(w, policy_from_spec(spec), profile.with_costs(shards=WIDE)).run().summary
    need = wide["gateway_shards_needed"]
    for _ in range(rounds):
        r = Simulation(w, policy_from_spec(spec), profile.with_costs(shards=need)).run()
        s = r.summary
        if s["gateway_shards_needed"] <= need and s["makespan_s"] <= (1 + SLOWER) * wide["makespan_s"]:
            break
        need = max(need + 1, s["gateway_shards_needed"])
    else:  # out of rounds: the run at the last count asked for
        r = Simulation(w, policy_from_spec(spec), profile.with_costs(shards=need)).run()
    return r, need


@dataclass
class Bound:
    profile: str
    engines: int
    policy: str
    shards: int
    by_mode: dict[str, dict[str, Any]]  # publish mode -> the run's summary

    def verdict(self, mode: str) -> str:
        idle = self.by_mode[mode].get("trainer_idle", 1.0)
        return "trainer" if idle < TRAINER_BOUND else "engines"


def bounds(
    w: Workload,
    profiles: list[EngineProfile],
    policies: list[str],
    gpus: int,
    done: Callable[[Bound], None] | None = None,
) -> list[Bound]:
    """Per profile and policy: the shards needed (sized under the profile's publish mode), then
    the run at that count once per publish mode (disk, memory); ``done`` hears each row."""
    out = []
    for prof in profiles:
        if prof.publish is None or prof.trainer is None:
            raise ConfigError(f"profile {prof.name} needs trainer and publish sections to say what bounds it")
        engines = gpus // prof.tensor_parallel
        if engines < 1:
            raise ConfigError(f"{gpus} GPUs hold no {prof.tensor_parallel}-GPU engine of {prof.name}")
        wl = w.model_copy(update={"engines": engines})
        for spec in policies:
            first, shards = sized(wl, spec, prof)
            by_mode = {}
            for mode in ("disk", "memory"):
                p = prof.with_costs(shards=shards, publish_mode=mode)
                same = mode == prof.publish.mode and first.summary["gateway_shards"] == shards
                by_mode[mode] = (
                    first.summary if same else Simulation(wl, policy_from_spec(spec), p).run().summary
                )
            out.append(Bound(prof.name, engines, first.policy, shards, by_mode))
            if done is not None:
                done(out[-1])
    return out


def table(rows: list[Bound], head: bool = True) -> str:
    """The markdown table of ``bounds`` (``head``: with its header lines)."""
    title = (
        "| profile | engines | policy | gateway shards (<= 70%) | output tok/s disk / memory | "
        "publish share disk / memory | trainer idle disk / memory | staleness disk / memory | bound by |"
    )
    lines = [title, "| --- " * 9 + "|"] if head else []
    for b in rows:
        d, m = b.by_mode["disk"], b.by_mode["memory"]

        def pair(key: str, fmt: str, d: dict[str, Any] = d, m: dict[str, Any] = m) -> str:
            return f"{d.get(key, 0.0):{fmt}} / {m.get(key, 0.0):{fmt}}"

        lines.append(
            f"| {b.profile} | {b.engines} | {b.policy} | {b.shards} | {pair('output_tok_s', ',.0f')} | "
            f"{pair('publish_share', '.2f')} | {pair('trainer_idle', '.2f')} | "
            f"{pair('staleness_mean', '.2f')} | "
            f"{b.verdict('disk')} / {b.verdict('memory')} |"
        )
    return "\n".join(lines)
