"""The gateway of a ``rollyard train`` run, in a process of its own.

Why a process: in the run's own process the gateway's event loop shared one interpreter lock
with the trainer (a training step's Python, checkpoint and publish work held every program's
requests). The run writes a ``GatewayProcessSpec`` (engines, tokenizer, journal, sockets,
scheduling, limits) to a file and starts ``python -m rollyard.gateway.process SPEC``; the admin
token comes in the environment (``ROLLYARD_ADMIN_TOKEN``), never on a command line or in the
file. Everything the run then asks of its gateway goes through the admin API
(``routes_admin``, ``routes_engines``), the same one any other client has. The process leaves
when the run stops it (SIGTERM: requests in flight are drained, then the journal is closed) or
when the run's process dies (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rollyard.core.errors import ConfigError
from rollyard.gateway.settings import GatewayLimits
from rollyard.gateway.shards import ShardLayout

log = logging.getLogger(__name__)

DRAIN_S = 5  # requests in flight at a stop get this long before they are cancelled


class EngineSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    url: str
    version: int = Field(default=0, ge=0)  # the weights it serves at start
    max_model_len: int | None = Field(default=None, ge=1)
    role: Literal["both", "prefill", "decode"] = "both"  # engine.role (prefill: first prompts only)


class GatewayProcessSpec(BaseModel):
    """What the gateway process serves, as the run configured it."""

    model_config = ConfigDict(extra="forbid")

    engines: list[EngineSpec] = Field(min_length=1)
    model_dir: Path  # the tokenizer and chat template
    model_name: str
    journal: Path
    host: str = "127.0.0.1"
    port: int = Field(ge=1, le=65535)
    uds: Path | None = None  # the sandboxes' door, when black-box agents run
    capacity: int = Field(default=64, ge=1)
    workers: int = Field(default=1, ge=1)  # shards (``gateway/shards.py``): port + k, journal-k.db
    policy: dict[str, Any] = Field(default_factory=lambda: {"policy": "fifo"})  # make_policy's arguments
    divide_tokens: int | None = Field(default=None, ge=1)
    pd_min_prompt_tokens: int = Field(default=512, ge=1)
    limits: GatewayLimits = Field(default_factory=GatewayLimits)

    def layout(self, index: int) -> ShardLayout:
        return ShardLayout(self.workers, index, self.port, self.uds, self.host)


def build_app(spec: GatewayProcessSpec, admin_token: str, layout: ShardLayout | None = None) -> Any:
    """The app the process (or shard ``layout.index``) serves; its own engine clients: the fence
    lives with them."""
    from rollyard.engines.vllm import VLLMBackend
    from rollyard.gateway.app import build_gateway, create_app
    from rollyard.gateway.tokenizer import FastTokenizer
    from rollyard.sched import make_policy

    options = dict(spec.policy)
    policy = make_policy(options.pop("policy"), **options)
    backends = {
        e.name: VLLMBackend(
            e.url,
            name=e.name,
            max_model_len=e.max_model_len,
            policy_version=e.version,
            timeout_s=spec.limits.engine_timeout_s,
        )
        for e in spec.engines
    }
    layout = layout or spec.layout(0)
    gw = build_gateway(
        backends,
        FastTokenizer(spec.model_dir),
        layout.journal_of(spec.journal.parent, layout.index) if layout.sharded else spec.journal,
        admin_token,
        spec.model_name,
        capacity=spec.capacity,
        policy=policy,
        divide_tokens=spec.divide_tokens,
        share=layout.share,
        roles={e.name: e.role for e in spec.engines},
        pd_min_prompt_tokens=spec.pd_min_prompt_tokens,
    )
    return create_app(gw, limits=spec.limits, layout=layout)


def serve_spec(layout: ShardLayout, spec_path: Path) -> None:
    """Serve ``spec_path``'s gateway as shard ``layout.index`` until SIGTERM."""
    import uvicorn

    from rollyard.gateway.heap import tune_heap
    from rollyard.gateway.serve import bind_tcp, bind_unix_socket, uvicorn_config

    token = os.environ.get("ROLLYARD_ADMIN_TOKEN")
    if not token:
        raise ConfigError("the gateway process needs ROLLYARD_ADMIN_TOKEN in its environment")
    spec = GatewayProcessSpec.model_validate_json(spec_path.read_text())
    app = build_app(spec, token, layout)
    sockets = [bind_tcp(spec.host, layout.port_of(layout.index))]
    uds = layout.uds_of(layout.index)
    if uds is not None:
        sockets.append(bind_unix_socket(uds))
    config = uvicorn_config(app, spec.limits, lifespan="on", timeout_graceful_shutdown=DRAIN_S)
    tune_heap(freeze=True)  # a process of its own: its start-up objects can be frozen
    uvicorn.Server(config).run(sockets=sockets)


def main(argv: list[str]) -> None:
    from rollyard.gateway.workers import Supervisor, die_with_parent

    die_with_parent()
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s gateway %(levelname)s %(name)s %(message)s"
    )
    if len(argv) != 1:
        raise SystemExit("usage: python -m rollyard.gateway.process SPEC.json")
    path = Path(argv[0])
    spec = GatewayProcessSpec.model_validate_json(path.read_text())
    if spec.workers == 1:
        serve_spec(spec.layout(0), path)
    else:  # a supervisor of shard processes, each serving its share of programs and engines
        Supervisor(spec.layout(0), serve_spec, path).run()


if __name__ == "__main__":
    main(sys.argv[1:])
