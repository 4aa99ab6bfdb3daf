"""The scheduler weighs the shared KV pool on real engines: two tiny-model engines share
``engine.kv_pool: {kind: local}`` and the gateway's policy has the pool's rate derived as
``rollyard train`` derives it. A program whose engine is busy moves to the idle one, charged a
load instead of a re-prefill (``rollyard_sched_moves_total{why="pool"}``); a program paused on
an engine out of KV room is restored on the other (``rollyard_sched_pool_restores_total``). In
both, the engine it lands on loads its context's blocks from the pool (the engines' own
prompt-token counters)."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import uvicorn

from rollyard.core.engine_key import engine_headers
from rollyard.engines.kvpool import KVPoolConfig
from rollyard.engines.kvpool.config import kv_bytes_per_token
from rollyard.engines.launcher import VLLMServer, free_port, start_together
from rollyard.engines.metrics import prompt_token_sources
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway import FastTokenizer, Gateway, build_gateway, create_app
from rollyard.sched import make_policy

pytestmark = [pytest.mark.engine, pytest.mark.slow]
ADMIN = "kvpool-sched-admin"
BLOCK = 64
BUDGET = 1000  # KV tokens per engine the pausing policy plans for (the restore test)
TURN = 8  # max_tokens of the restore test's programs: the decode reserve each claims


@pytest.fixture(scope="module")
def engines(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    tmp = tmp_path_factory.mktemp("kvpool-sched")
    pool = KVPoolConfig(kind="local", root=str(tmp / "pool"))
    common = dict(kv_tokens=4096, max_model_len=1024, served_name="tiny", kv_pool=pool, startup_timeout_s=900)
    servers = [VLLMServer(tiny_model_dir, log_path=tmp / f"e{i}.log", **common) for i in range(2)]
    try:
        start_together(servers, tmp)
        yield [s.url for s in servers]
    finally:
        for s in servers:
            s.stop()


def serve(gw: Gateway) -> tuple[str, uvicorn.Server, threading.Thread]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(gw), port=port, log_level="warning"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    for _ in range(100):
        if server.started:
            break
        time.sleep(0.1)
    return f"http://127.0.0.1:{port}", server, t


def made(url: str, max_tokens: int, ignore_eos: bool = False) -> tuple[str, str]:
    """A new program at T=0: its id and API key."""
    body = {"sampling": {"temperature": 0.0, "max_tokens": max_tokens, "ignore_eos": ignore_eos}}
    r = httpx.post(f"{url}/programs", json=body, headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code == 201, r.text
    return str(r.json()["id"]), str(r.json()["api_key"])


def program(url: str, max_tokens: int, ignore_eos: bool = False) -> str:
    return made(url, max_tokens, ignore_eos)[1]


def chat(url: str, key: str, messages: list[dict[str, str]]) -> dict:
    r = httpx.post(
        f"{url}/v1/chat/completions", json={"model": "tiny", "messages": messages},
        headers={"Authorization": f"Bearer {key}"}, timeout=600,
    )  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega", "sigma"]) for _ in range(n))


def sources(url: str) -> dict[str, int]:
    return prompt_token_sources(httpx.get(f"{url}/metrics", headers=engine_headers()).text)


def test_a_program_on_a_busy_engine_moves_to_an_idle_one_and_loads_its_context(
    engines: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    rate = KVPoolConfig(kind="local").load_tok_s(kv_bytes_per_token(tiny_model_dir, "float32"))
    gw = build_gateway(
        {f"e{i}": VLLMBackend(u, name=f"e{i}") for i, u in enumerate(engines)},
        FastTokenizer(tiny_model_dir), tmp_path / "journal.db", ADMIN, "tiny",
        policy=make_policy("rollyard", pool_load_tok_s=rate), capacity=1,
    )  # fmt: skip
    url, server, thread = serve(gw)
    state = gw.pool.scheduler.state
    try:
        p = program(url, 16)
        history = [{"role": "user", "content": words(200, 1)}]
        first = chat(url, p, history)  # placed on e0 (both empty); its time there is measured
        assert state.engines["e0"].service_s > 0
        chat(url, program(url, 8), [{"role": "user", "content": words(500, 2)}])  # e1: fewer tokens
        before = sources(engines[1])
        # goes to e0 (fewer tokens there) and holds its slot for as long as the model length allows
        # (a 300-token hog ended before turn 2 arrived on a fast CI machine)
        hog = program(url, 1000, ignore_eos=True)
        hog_done: list[float] = []

        def hold() -> None:
            chat(url, hog, [{"role": "user", "content": "go"}])
            hog_done.append(time.monotonic())

        busy = threading.Thread(target=hold)
        busy.start()
        for _ in range(1200):
            if state.engines["e0"].in_flight == 1:
                break
            time.sleep(0.01)
        assert state.engines["e0"].in_flight == 1, "the long request did not start on e0"
        history += [first["choices"][0]["message"], {"role": "user", "content": words(40, 3)}]
        sent = time.monotonic()
        second = chat(url, p, history)
        after = sources(engines[1])
        busy.join(600)
        moves = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text
        assert hog_done and hog_done[0] > sent, "the hog ended before turn 2 was sent: nothing to move from"
        assert gw.pool.counts["pool_moves"] == 1 and gw.pool.counts["moves"] == 1, gw.pool.counts
        assert 'rollyard_sched_moves_total{why="pool"} 1.0' in moves
        # turn 2 ran on e1 and loaded turn 1's full blocks (prompt and output) from the pool
        context1 = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
        loaded = after.get("external_kv_transfer", 0) - before.get("external_kv_transfer", 0)
        computed = after.get("local_compute", 0) - before.get("local_compute", 0)
        assert loaded >= (context1 - 1) // BLOCK * BLOCK - BLOCK > 0
        assert loaded + computed == second["usage"]["prompt_tokens"]
    finally:
        server.should_exit = True
        thread.join(10)


def metrics_text(url: str) -> str:
    return httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {ADMIN}"}).text


def sized(tok: FastTokenizer, tokens: int, seed: int) -> str:
    """The shortest ``words(n, seed)`` that is ``tokens`` tokens or more (each word is one token
    or more, and a longer ``n`` extends a shorter one)."""
    n = max(1, tokens // 4)
    while len(tok.encode(words(n, seed))) < tokens:
        n += 1
    return words(n, seed)


def test_a_program_paused_for_room_is_restored_on_the_other_engine_and_loads_its_context(
    engines: list[str], tiny_model_dir: Path, tmp_path: Path
) -> None:
    """ThunderAgent's admission with a 1,000-token budget per engine: a and c share e0, b is on
    e1; a's second turn grows e0 past the budget, so c (acting, the smallest) is paused, and the
    next tick restores it where it fits: e1, off its own engine, so its next turn loads c's
    first turn from the pool instead of prefilling it. a's second message is sized with the
    tokenizer from the contexts the scheduler holds, so the budget is crossed by half of c's
    context whatever the model answered."""
    rate = KVPoolConfig(kind="local").load_tok_s(kv_bytes_per_token(tiny_model_dir, "float32"))
    policy = make_policy("thunder", tick_s=0.5, kv_tokens=BUDGET, pool_load_tok_s=rate)
    tok = FastTokenizer(tiny_model_dir)
    gw = build_gateway(
        {f"e{i}": VLLMBackend(u, name=f"e{i}") for i, u in enumerate(engines)},
        tok, tmp_path / "journal.db", ADMIN, "tiny", policy=policy,
    )  # fmt: skip
    url, server, thread = serve(gw)
    programs = gw.pool.scheduler.state.programs
    try:
        (a, a_key), (b, b_key), (c, c_key) = (made(url, TURN) for _ in range(3))
        a_history = [{"role": "user", "content": words(30, 11)}]
        a_first = chat(url, a_key, a_history)  # e0: both engines empty, the tie goes to the name
        chat(url, b_key, [{"role": "user", "content": words(200, 12)}])  # e1: no tokens there
        c_history = [{"role": "user", "content": words(120, 13)}]
        c_first = chat(url, c_key, c_history)  # e0: a's few tokens against b's many
        assert [programs[p].engine for p in (a, b, c)] == ["e0", "e1", "e0"], programs
        assert gw.pool.counts["pauses"] == 0, "paused before e0 was out of room"
        # a claim is its context plus TURN (kv.reserve_tokens); c must fit beside b on e1
        ctx = {p: programs[p].context_tokens for p in (a, b, c)}
        assert ctx[b] + ctx[c] + 2 * TURN <= BUDGET, ctx
        # a's second prompt p pauses c when p + ctx[c] + 2 TURN > BUDGET, and a alone still fits
        # after its turn when p + 2 TURN <= BUDGET: aim at the middle of that window
        low, high = BUDGET - ctx[c] - 2 * TURN, BUDGET - 2 * TURN
        framing = a_first["usage"]["prompt_tokens"] - len(tok.encode(a_history[0]["content"]))
        message = sized(tok, (low + high) // 2 - ctx[a] - framing, 14)
        a_history += [a_first["choices"][0]["message"], {"role": "user", "content": message}]
        a_second = chat(url, a_key, a_history)  # e0 now claims more than the budget
        assert low < a_second["usage"]["prompt_tokens"] <= high, (low, a_second["usage"], high)
        for _ in range(300):
            if gw.pool.counts["restores"]:
                break
            time.sleep(0.05)
        assert gw.pool.counts["pauses"] == 1 and gw.pool.counts["pool_restores"] == 1, gw.pool.counts
        assert programs[c].engine == "e1" and not programs[c].paused
        assert "rollyard_sched_pool_restores_total 1.0" in metrics_text(url)
        before = [sources(e) for e in engines]
        c_history += [c_first["choices"][0]["message"], {"role": "user", "content": words(20, 15)}]
        c_second = chat(url, c_key, c_history)
        after = [sources(e) for e in engines]
        assert 'rollyard_sched_moves_total{why="restore"} 1.0' in metrics_text(url)  # re-homed by it
    finally:
        server.should_exit = True
        thread.join(10)
    assert after[0] == before[0]  # nothing of c's second turn ran on its old engine
    context1 = c_first["usage"]["prompt_tokens"] + c_first["usage"]["completion_tokens"]
    loaded = after[1].get("external_kv_transfer", 0) - before[1].get("external_kv_transfer", 0)
    computed = after[1].get("local_compute", 0) - before[1].get("local_compute", 0)
    assert loaded >= (context1 - 1) // BLOCK * BLOCK - BLOCK > 0  # c's first turn, from the pool
    assert loaded + computed == c_second["usage"]["prompt_tokens"]
