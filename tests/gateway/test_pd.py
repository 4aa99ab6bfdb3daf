"""Prefill/decode roles in the gateway (scripted engines): a program's long first prompt is
prefilled on the prefill engine (max_tokens 1), then served by a decode engine; later turns and
short prompts skip the prefill engine, which never holds a program; and the config's checks."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from tests.gateway.conftest import ADMIN, ScriptedBackend, new_program

from rollyard.core.errors import ConfigError, EngineError, EngineUnavailable, InvalidRequest
from rollyard.core.sampling import SamplingParams
from rollyard.engines.base import Completion
from rollyard.engines.kvpool.config import KVPoolConfig
from rollyard.gateway import FastTokenizer, build_gateway, create_app
from rollyard.rollout.config import Config

LONG = " ".join(["alpha beta gamma"] * 60)


def chat(client: TestClient, key: str, messages: list[dict[str, str]]) -> dict:
    r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": messages},
                    headers={"Authorization": f"Bearer {key}"})  # fmt: skip
    assert r.status_code == 200, r.text
    return r.json()


def test_a_long_first_prompt_is_prefilled_on_the_prefill_engine_then_decoded_elsewhere(
    tok: FastTokenizer, tmp_path: Path
) -> None:
    pre, dec = ScriptedBackend(tok, "pre"), ScriptedBackend(tok, "dec")
    gw = build_gateway(
        {"pre": pre, "dec": dec}, tok, tmp_path / "j.db", ADMIN, "tiny",
        roles={"pre": "prefill", "dec": "decode"}, pd_min_prompt_tokens=100,
    )  # fmt: skip
    with TestClient(create_app(gw, poll_interval_s=0.05)) as client:
        key = str(new_program(client)["api_key"])
        history = [{"role": "user", "content": LONG}]
        first = chat(client, key, history)
        assert len(pre.prompts) == 1 and pre.params[0].max_tokens == 1
        assert dec.prompts == pre.prompts and dec.params[0].max_tokens > 1  # the same prompt, decoded
        assert first["usage"]["prompt_tokens"] == len(pre.prompts[0]) >= 100
        history += [first["choices"][0]["message"], {"role": "user", "content": LONG}]
        chat(client, key, history)  # a later turn: its decode engine holds the context
        short = str(new_program(client)["api_key"])
        chat(client, short, [{"role": "user", "content": "hi"}])  # under the threshold
        assert (len(pre.prompts), len(dec.prompts)) == (1, 3)
        assert gw.pool.counts["pd_prefills"] == 1
        assert {p.engine for p in gw.pool.scheduler.state.programs.values()} == {"dec"}
        assert gw.pool.scheduler.healthy_engines() == ["dec"]
        assert sorted(gw.pool.scheduler.up_engines()) == ["dec", "pre"]


def test_a_failed_prefill_leaves_the_prompt_to_the_decode_engine(tok: FastTokenizer, tmp_path: Path) -> None:
    """A healthy prefill engine whose call fails (unreachable, then a 5xx): the turn is served by
    the decode engine and the failures are counted; a client error from it reaches the client."""
    pre, dec = ScriptedBackend(tok, "pre"), ScriptedBackend(tok, "dec")
    pre.errors = [EngineUnavailable("pre dropped the connection"), EngineError("pre returned 500")]
    gw = build_gateway(
        {"pre": pre, "dec": dec}, tok, tmp_path / "j.db", ADMIN, "tiny",
        roles={"pre": "prefill", "dec": "decode"}, pd_min_prompt_tokens=10,
    )  # fmt: skip
    with TestClient(create_app(gw, poll_interval_s=0.05)) as client:
        for _ in range(2):
            chat(client, str(new_program(client)["api_key"]), [{"role": "user", "content": LONG}])
        assert not pre.errors and pre.prompts == []  # both scripted failures were met, none ran
        assert len(dec.prompts) == 2 and dec.params[0].max_tokens > 1
        assert gw.pool.counts["pd_prefills"] == 0 and gw.pool.counts["pd_prefill_failures"] == 2
        text = client.get("/metrics", headers={"x-api-key": ADMIN}).text
        assert 'rollyard_gateway_pd_prefill_failures_total{engine="pre"} 2.0' in text
        pre.errors = [InvalidRequest("the engine refused this prompt")]
        key = str(new_program(client)["api_key"])
        body = {"model": "tiny", "messages": [{"role": "user", "content": LONG}]}
        r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 400 and len(dec.prompts) == 2  # not sent on to the decode engine


class SlowBackend(ScriptedBackend):
    """A prefill engine that takes ``delay_s`` before answering (or raising its scripted error)."""

    delay_s = 1.0

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Completion:
        await asyncio.sleep(self.delay_s)
        return await super().generate(prompt_ids, params)


@pytest.mark.parametrize("fails", [False, True])
def test_only_a_prefill_that_ran_counts_as_engine_time(
    fails: bool, tok: FastTokenizer, tmp_path: Path
) -> None:
    """The gateway's overhead (total minus engine time) excludes a prefill that ran, and includes
    the time a failed one took: that second served nobody."""
    pre, dec = SlowBackend(tok, "pre"), ScriptedBackend(tok, "dec")
    pre.errors = [EngineError("pre returned 500")] if fails else []
    gw = build_gateway(
        {"pre": pre, "dec": dec}, tok, tmp_path / "j.db", ADMIN, "tiny",
        roles={"pre": "prefill", "dec": "decode"}, pd_min_prompt_tokens=10,
    )  # fmt: skip
    with TestClient(create_app(gw, poll_interval_s=0.05)) as client:
        chat(client, str(new_program(client)["api_key"]), [{"role": "user", "content": LONG}])
    overhead = gw.metrics.overhead.collect()[0].samples
    total = next(x.value for x in overhead if x.name.endswith("_sum"))
    assert gw.pool.counts["pd_prefill_failures"] == int(fails)
    assert (total >= pre.delay_s) if fails else (total < pre.delay_s)


def test_a_prompt_within_one_kv_block_is_not_prefilled(tok: FastTokenizer, tmp_path: Path) -> None:
    """Over pd_min_prompt_tokens but with no full block before its last token: nothing the decode
    engine could load, so no prefill engine's time is spent on it."""
    pre, dec = ScriptedBackend(tok, "pre"), ScriptedBackend(tok, "dec")
    gw = build_gateway(
        {"pre": pre, "dec": dec}, tok, tmp_path / "j.db", ADMIN, "tiny",
        roles={"pre": "prefill", "dec": "decode"}, pd_min_prompt_tokens=2,
    )  # fmt: skip
    assert gw.pd is not None and gw.pd.block_size == 64
    with TestClient(create_app(gw, poll_interval_s=0.05)) as client:
        chat(client, str(new_program(client)["api_key"]), [{"role": "user", "content": "hi"}])
        assert 2 <= len(dec.prompts[0]) <= 64 and pre.prompts == []
        chat(client, str(new_program(client)["api_key"]), [{"role": "user", "content": LONG}])
        assert len(pre.prompts) == 1 and len(pre.prompts[0]) > 65  # one full block: prefilled


def test_no_prefill_runs_while_no_decode_engine_is_healthy(tok: FastTokenizer, tmp_path: Path) -> None:
    pre, dec = ScriptedBackend(tok, "pre"), ScriptedBackend(tok, "dec")
    dec.down = True
    gw = build_gateway(
        {"pre": pre, "dec": dec}, tok, tmp_path / "j.db", ADMIN, "tiny",
        roles={"pre": "prefill", "dec": "decode"}, pd_min_prompt_tokens=10,
    )  # fmt: skip
    with TestClient(create_app(gw, poll_interval_s=0.05)) as client:
        key = str(new_program(client)["api_key"])
        body = {"model": "tiny", "messages": [{"role": "user", "content": LONG}]}
        r = client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 503 and pre.prompts == [] and dec.prompts == []


@pytest.mark.parametrize(
    ("roles", "why"),
    [
        ({"pre": "prefil", "dec": "decode"}, "role 'prefil' is not one of"),
        ({"pre": "prefill", "engine9": "decode"}, "'engine9', which is not an engine"),
        ({"pre": "prefill", "dec": "prefill"}, "at least one engine must decode"),
    ],
)
def test_the_gateway_refuses_bad_roles(
    roles: dict[str, str], why: str, tok: FastTokenizer, tmp_path: Path
) -> None:
    backends = {"pre": ScriptedBackend(tok, "pre"), "dec": ScriptedBackend(tok, "dec")}
    with pytest.raises(ConfigError, match=why):
        build_gateway(backends, tok, tmp_path / "j.db", ADMIN, "tiny", roles=roles)


def test_roles_need_a_pool_and_a_decoding_engine_and_map_to_vllms_kv_role() -> None:
    pool = {"kind": "local"}
    ok = Config.model_validate({"model": {"path": "m"}, "engine": {"count": 2, "role": ["prefill", "decode"],
                                                                   "kv_pool": pool}})  # fmt: skip
    assert ok.engine.roles() == ["prefill", "decode"]
    bad = [
        ({"count": 2, "role": ["prefill", "decode"]}, "needs engine.kv_pool"),
        ({"count": 2, "role": "prefill", "kv_pool": pool}, "at least one engine must decode"),
        ({"count": 2, "role": ["decode"], "kv_pool": pool}, "1 roles for 2 engines"),
    ]
    for engine, why in bad:
        with pytest.raises(ValidationError, match=why):
            Config.model_validate({"model": {"path": "m"}, "engine": engine})
    for kind in ("local", "mooncake", "lmcache"):  # store-based: a decode engine saves its own blocks too
        pool_cfg = KVPoolConfig(kind=kind)
        roles = {r: pool_cfg.transfer_config(role=r)["kv_role"] for r in ("both", "prefill", "decode")}  # type: ignore[index]
        assert roles == {"both": "kv_both", "prefill": "kv_producer", "decode": "kv_both"}, kind


@pytest.mark.parametrize(
    ("args", "why"), [(["--role", "sideways"], "--role"), (["--role", "decode"], "needs --kv-pool")]
)
def test_engine_serve_refuses_a_bad_role_before_starting(args: list[str], why: str, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from rollyard.cli import _register, app

    _register()
    res = CliRunner().invoke(app, ["engine", "serve", "--model", str(tmp_path), *args])
    assert isinstance(res.exception, ConfigError) and why in res.exception.message


def test_a_runs_roles_reach_its_gateway_process(tiny_model_dir: Path, tmp_path: Path) -> None:
    """``rollyard train``'s path: config -> GatewayProcessSpec -> the gateway process's app."""
    from rollyard.gateway.process import build_app
    from rollyard.rollout.gateway_proc import gateway_spec
    from rollyard.rollout.remote_fence import RemoteFenced

    cfg = Config.model_validate({
        "model": {"path": "m"}, "gateway": {"pd_min_prompt_tokens": 300},
        "engine": {"count": 2, "role": ["prefill", "decode"], "kv_pool": {"kind": "local"}},
    })  # fmt: skip
    backends = [RemoteFenced(f"http://127.0.0.1:{9000 + i}", name=f"engine{i}") for i in range(2)]
    spec = gateway_spec(cfg, tmp_path, backends, tiny_model_dir, 8123, None)
    assert [e.role for e in spec.engines] == ["prefill", "decode"] and spec.pd_min_prompt_tokens == 300
    assert spec.policy["pool_load_tok_s"] > 0  # from engine.kv_pool
    gw = build_app(spec, ADMIN).state.gateway
    assert gw.pd is not None and gw.pd.names == ["engine0"] and gw.pd.min_prompt_tokens == 300
    assert gw.pool.scheduler.healthy_engines() == ["engine1"]
