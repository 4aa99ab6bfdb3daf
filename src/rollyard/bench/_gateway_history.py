"""The gateway bench's prompt-length levels: the CPU of one turn as a conversation grows.

Each of ``PROGRAMS`` programs is an agent's conversation: a turn sends the whole history back
(the assistant messages exactly as the gateway returned them) plus a new user message, as an
OpenAI client does. A set of conversations per level is grown with user messages (tool output)
of ~1k tokens, or of ~60 for ``14k_short`` (the same length in ~16x the messages, as an agent of
many short steps has), until they hold about ``level`` prompt tokens; then the measured turns
each add a short message, all programs of a set at once, in rounds that visit every level in a
rotating order; ``cpu_ms_per_req`` is the median over rounds of the gateway's CPU per turn,
``ratio_30k_vs_14k`` the median of the rounds' 30k/14k ratios, and ``ratio_14k_short_vs_14k``
theirs of the two 14k levels (what a history's number of messages costs apart from its
tokens). The same ids posted to the bare relay give its floor at that length
(``floor_cpu_ms_per_req``: what moving the bytes costs any Python hop). A gateway whose work
per turn grows with the history shows it as a growing ``cpu_ms_per_req`` from level to level;
the goal is a flat one.

Only with the canned engine (its context is raised to fit the longest level): a real engine on
these cores would spend seconds on each 30k-token prefill.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from typing import Any

import aiohttp

from rollyard.bench._gateway_load import MAX_TOKENS, Workload, _programs
from rollyard.bench._gateway_rounds import median_ratio
from rollyard.bench._procs import ADMIN, _cpu_seconds
from rollyard.gateway.tokenizer import Tokenizer

PROGRAMS = 64
# name: (prompt tokens, tokens of each growing turn's user message: a tool's output)
LEVELS = {"900": (900, 1000), "14k": (14_000, 1000), "30k": (30_000, 1000), "14k_short": (14_000, 60)}
CONTEXT = 40_960  # the canned engine's max_model_len while these levels run
_WORDS = (
    "def",
    "return",
    "self",
    "value",
    "result",
    "items",
    "index",
    "count",
    "else",
    "for",
    "while",
    "import",
    "class",
    "yield",
)


class Filler:
    """Deterministic code-like text, sized in the bench model's tokens (measured once)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        sample = self._text(random.Random(0), 20_000)
        self.chars_per_token = len(sample) / len(tokenizer.encode(sample))

    @staticmethod
    def _text(rng: random.Random, chars: int) -> str:
        lines, n = [], 0
        while n < chars:
            line = (
                f"    {rng.choice(_WORDS)} v{rng.randrange(1000)} = {rng.choice(_WORDS)}({rng.randrange(99)})"
            )
            lines.append(line)
            n += len(line) + 1
        return "\n".join(lines)

    def text(self, seed: int, tokens: int) -> str:
        return self._text(random.Random(seed), int(tokens * self.chars_per_token))


class Conversation:
    """One program's history, as its client holds it."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
        self.prompt_tokens = 0

    async def turn(self, session: aiohttp.ClientSession, url: str, user: str) -> None:
        self.messages.append({"role": "user", "content": user})
        body = {"model": "tiny", "messages": self.messages, "max_tokens": MAX_TOKENS, "temperature": 1.0}
        headers = {"Authorization": f"Bearer {self.key}"}
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            data = await r.json()
            if r.status != 200:
                raise RuntimeError(f"history turn failed ({r.status}): {str(data)[:300]}")
        msg = data["choices"][0]["message"]
        echoed: dict[str, Any] = {"role": "assistant", "content": msg.get("content") or ""}
        if msg.get("tool_calls"):
            echoed["tool_calls"] = msg["tool_calls"]
        self.messages.append(echoed)
        self.prompt_tokens = int(data["usage"]["prompt_tokens"])


async def _all(convs: list[Conversation], session: aiohttp.ClientSession, url: str, texts: list[str]) -> None:
    """One turn of every conversation at once, each with its own new user message."""
    await asyncio.gather(*(c.turn(session, url, t) for c, t in zip(convs, texts, strict=True)))


async def run_levels(
    session: aiohttp.ClientSession,
    gw: tuple[str, int],
    relay: tuple[str, int],
    work: Workload,
    rounds: int,
    turns_per_round: int,
) -> dict[str, Any]:
    """Grow a set of ``PROGRAMS`` conversations to each of ``LEVELS``; then ``rounds`` rounds,
    each a block per level in an order that rotates: ``turns_per_round`` turns of every program
    of that level's set, the gateway's CPU per turn, then the relay's for bodies of the same
    length (each conversation rendered fresh by the bench). Ratios between levels are medians of
    per-round ratios: measured a level after another, minutes apart, the load that other work
    put on the shared cores moved ``cpu_30k_vs_14k`` of one build from 1.24 to 1.68."""
    url, pid = gw
    filler = Filler(work.renderer.tok)
    rewrites_before = await _rewrites(session, url)
    sets: dict[str, list[Conversation]] = {}
    grown = 0
    for name, (target, grow) in LEVELS.items():
        _, keys = await _programs(session, url, PROGRAMS)
        convs = sets[name] = [Conversation(k) for k in keys]
        # grown to ``target`` less half what the measured turns add: they are centred on it
        start = target - rounds * turns_per_round * (MAX_TOKENS + 30) // 2
        while (short := start - min(c.prompt_tokens for c in convs)) > 50:
            grown += 1
            texts = [filler.text(grown * 1000 + i, min(grow, short)) for i in range(len(convs))]
            await _all(convs, session, url, texts)
    per: dict[str, list[float]] = {name: [] for name in LEVELS}
    floor: dict[str, list[float]] = {name: [] for name in LEVELS}
    names = list(LEVELS)
    turn = 0
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            convs = sets[name]
            cpu0 = _cpu_seconds(pid)
            for _ in range(turns_per_round):
                turn += 1
                texts = [f"step {turn}: run the tests again, {i}" for i in range(len(convs))]
                await _all(convs, session, url, texts)
            per[name].append(1000 * (_cpu_seconds(pid) - cpu0) / (turns_per_round * PROGRAMS))
            floor[name] += await _relay_rounds(session, work, relay, convs, 1, turns_per_round)
    out: dict[str, Any] = {"programs": PROGRAMS, "grow_tokens": {k: g for k, (_, g) in LEVELS.items()}}
    for name, convs in sets.items():
        out[name] = {
            "prompt_tokens": [min(c.prompt_tokens for c in convs), max(c.prompt_tokens for c in convs)],
            "messages": len(convs[0].messages),
            "cpu_ms_per_req": per[name],
            "median_cpu_ms_per_req": statistics.median(per[name]),
            "floor_cpu_ms_per_req": floor[name],
            "median_floor_cpu_ms_per_req": statistics.median(floor[name]),
        }
    for a, b in (("14k", "30k"), ("14k", "14k_short")):
        out[f"ratio_{b}_vs_{a}"] = median_ratio(per, b, a)
    # Every turn here must have extended its conversation: a rewrite would render the whole
    # history fresh and measure something else (the bench's other levels' chats are rewrites).
    rewrites = await _rewrites(session, url) - rewrites_before
    if rewrites:
        raise RuntimeError(f"{rewrites:.0f} history turns were rewrites, not extensions")
    return out


async def _relay_rounds(
    session: aiohttp.ClientSession,
    work: Workload,
    relay: tuple[str, int],
    convs: list[Conversation],
    rounds: int,
    turns_per_round: int,
) -> list[float]:
    """The relay's CPU per request for engine bodies as long as the programs' prompts (each
    conversation rendered fresh by the bench's renderer: the gateway's ids but for how it closes
    unfinished completions), posted ``turns_per_round`` times a round."""
    bodies = [await work.direct_history(c.messages) for c in convs]
    out = []
    for _ in range(rounds):
        cpu0 = _cpu_seconds(relay[1])
        for _ in range(turns_per_round):
            await asyncio.gather(*(_post_relay(session, relay[0], b) for b in bodies))
        out.append(1000 * (_cpu_seconds(relay[1]) - cpu0) / (turns_per_round * len(bodies)))
    return out


async def _post_relay(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> None:
    async with session.post(f"{url}/v1/completions", json=body) as r:
        r.raise_for_status()
        await r.read()


async def _rewrites(session: aiohttp.ClientSession, url: str) -> float:
    """The gateway's count of history rewrites (turns that started a new segment)."""
    async with session.get(f"{url}/metrics", headers={"x-api-key": ADMIN}) as r:
        text = await r.text()
    for line in text.splitlines():
        if line.startswith("rollyard_gateway_context_rewrites_total"):
            return float(line.split()[-1])
    return 0.0
