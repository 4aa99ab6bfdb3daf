"""Start and stop a local vLLM server with the settings that work on a laptop CPU.

The server runs in its own process group, so stopping it (or the test session ending)
takes down its engine-core workers too, also when the API server (the group's leader) is
already dead: its EngineCore and workers outlived a ``kill -9`` of it, ~1.8 GB, while the
stop saw only the dead leader. Its output goes to a log file whose tail is quoted in any
start-up error.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol

import httpx

from rollyard.core.engine_key import KEY_ENV, engine_headers, engine_key
from rollyard.core.errors import ConfigError, EngineStartError
from rollyard.core.net import free_port
from rollyard.engines.access import MIDDLEWARE
from rollyard.engines.drafting.config import DraftingConfig
from rollyard.engines.kvpool.config import KVPoolConfig, Role
from rollyard.engines.tiny_model import check_model_dir, model_positions

log = logging.getLogger(__name__)

DEFAULT_BLOCK_SIZE = 64  # the CPU attention kernels reject 16


def port_in_use(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def group_members(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``, from /proc."""
    out = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()  # state, ppid, pgrp, ...
        if fields[0] not in (b"Z", b"X") and int(fields[2]) == pgid:
            out.append(int(entry.name))
    return out


def end_group(pgid: int, timeout_s: float) -> list[int]:
    """SIGTERM process group ``pgid``, SIGKILL what is left after ``timeout_s``; the pids still
    there after that (none, unless the kernel is slow to tear them down)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while (left := group_members(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def has_cuda_gpu() -> bool:
    return shutil.which("nvidia-smi") is not None and os.path.exists("/dev/nvidia0")


def serving_dtype() -> str:
    """The dtype an engine serves in when none is given: bfloat16 on CUDA, float32 on CPU; its KV
    cache takes the same dtype (what the pool's load cost is priced in)."""
    return "bfloat16" if has_cuda_gpu() else "float32"


class EngineProcess(Protocol):
    """What a run starts, health-checks and restarts: a ``VLLMServer`` here, or one on a Ray
    node (``rollout.ray_engines.RayEngine``)."""

    model_dir: Path
    weights_version: int

    @property
    def url(self) -> str: ...

    def start(self) -> EngineProcess: ...

    def alive(self) -> bool: ...

    def stop(self, timeout_s: float = 15.0) -> None: ...

    def kill(self, wait: bool = True) -> None: ...


class VLLMServer:
    """A local vLLM OpenAI-compatible server; also a context manager.

    ``kv_tokens`` caps the KV cache (via a block-count override) so KV pressure is
    reproducible on a laptop; on a CUDA host the KV cache is what ``gpu_memory_utilization``
    leaves instead, the weights are bf16 (fp32 on CPU) and ``tensor_parallel_size`` shards the
    model (GPU paths untested). ``cpu_threads`` pins the engine's OpenMP threads. ``drafting``
    turns on speculative decoding (``engine.drafting``); ``kv_pool`` a KV pool shared with
    other engines (``engine.kv_pool``), keyed by ``weights_version``; ``role`` the engine's part
    in a prefill/decode split (``engine.role``, vLLM's ``kv_role`` on the pool's connector).
    """

    def __init__(
        self,
        model_dir: str | Path,
        *,
        port: int | None = None,
        host: str = "127.0.0.1",
        kv_tokens: int | None = None,
        dtype: str | None = None,  # None: bfloat16 on a CUDA host, float32 on CPU
        max_model_len: int = 2048,
        served_name: str | None = None,
        log_path: str | Path | None = None,
        startup_timeout_s: float = 300.0,
        block_size: int = DEFAULT_BLOCK_SIZE,
        extra_args: list[str] | None = None,
        cpu_threads: str | None = None,
        drafting: DraftingConfig | None = None,
        kv_pool: KVPoolConfig | None = None,
        weights_version: int = 0,
        tensor_parallel_size: int = 1,
        gpu_memory_utilization: float = 0.9,
        role: Role = "both",
    ) -> None:
        self.model_dir = Path(model_dir)
        self.host = host
        self.port = port
        self.kv_tokens = kv_tokens
        self.dtype = dtype or serving_dtype()
        self.tensor_parallel_size = tensor_parallel_size
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.served_name = served_name or self.model_dir.name
        self.log_path = Path(log_path) if log_path else None
        self.startup_timeout_s = startup_timeout_s
        self.block_size = block_size
        self.extra_args = list(extra_args or [])
        self.cpu_threads = cpu_threads
        self.drafting = drafting or DraftingConfig()
        self.kv_pool = kv_pool or KVPoolConfig()
        self.weights_version = weights_version  # the pool keys KV by it (``kvpool.connector``)
        self.role: Role = role  # prefill/decode split (``engine.role``): the pool connector's kv_role
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        args = [
            sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--served-model-name", self.served_name,
            "--host", self.host,
            "--port", str(self.port),
            "--dtype", self.dtype,
            "--max-model-len", str(self.max_model_len),
            "--enable-prefix-caching",
            "--block-size", str(self.block_size),
            "--max-logprobs", "20",
            "--middleware", MIDDLEWARE,  # every route, dev mode's included, needs the engine key
        ]  # fmt: skip
        if not has_cuda_gpu():
            args.append("--enforce-eager")  # ~35 s start on CPU instead of ~100 s with torch.compile
            # Without it, in-place weight reloads do not reach the CPU's prepacked GEMMs.
            args += ["--worker-extension-cls", "rollyard.engines.vllm_worker_ext.LiveWeightsExtension"]
        else:  # memory publishing on CUDA: vLLM's NCCL weight transfer (train/nccl_publish.py)
            args += ["--weight-transfer-config", '{"backend": "nccl"}']
            args += ["--gpu-memory-utilization", str(self.gpu_memory_utilization)]
            args += ["--tensor-parallel-size", str(self.tensor_parallel_size)]
        if self.kv_tokens is not None and not has_cuda_gpu():  # GPU: sized by memory utilization
            if self.kv_tokens <= self.max_model_len:
                raise ConfigError(
                    f"kv_tokens={self.kv_tokens} must exceed max_model_len={self.max_model_len} "
                    "(vLLM needs room for one full-length request)"
                )
            blocks = math.ceil(self.kv_tokens / self.block_size)
            args += ["--num-gpu-blocks-override", str(blocks)]
        args += self.kv_pool.engine_args(cuda=has_cuda_gpu(), epoch=self.weights_version, role=self.role)
        return args + self.drafting.engine_args() + self.extra_args

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_SERVER_DEV_MODE="1",  # /pause, /resume, /collective_rpc (weight reload)
            **{KEY_ENV: engine_key()},  # behind the key (``engines.access``)
            VLLM_LOGGING_LEVEL=env.get("VLLM_LOGGING_LEVEL", "WARNING"),
        )
        # Idle keep-alive connections outlive the gateway's (4 s) by far: with uvicorn's 5 s a
        # busy gateway loop reused connections the engine had just closed (see engines.vllm).
        env.setdefault("VLLM_HTTP_TIMEOUT_KEEP_ALIVE", "60")
        env.update(self.drafting.environment())
        env.update(
            self.kv_pool.environment(Path(self.log_path or "engine.log").with_suffix(".mooncake.json"))
        )
        if not has_cuda_gpu():
            cpus = os.cpu_count() or 1
            env.setdefault("VLLM_CPU_OMP_THREADS_BIND", self.cpu_threads or f"0-{max(0, cpus - 1)}")
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        return env

    def start(self) -> VLLMServer:
        check_model_dir(self.model_dir)
        limit = model_positions(self.model_dir)
        if limit and self.max_model_len > limit:
            # vLLM would refuse to start, or with its override emit pad tokens past the limit.
            raise ConfigError(
                f"max_model_len={self.max_model_len} exceeds the model's {limit} positions "
                f"({self.model_dir}); lower it, or make a model with more positions "
                "(rollyard model init --max-context N)"
            )
        if self.port is None:
            self.port = free_port()
        elif port_in_use(self.port, self.host):
            raise EngineStartError(f"port {self.port} is already in use")
        if self.log_path is None:
            fd, name = tempfile.mkstemp(prefix="rollyard-vllm-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as logf:
            self.proc = subprocess.Popen(
                self.command(),
                stdout=logf,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=self.environment(),
                start_new_session=True,  # its own process group: we stop all of it
            )
        atexit.register(self.stop)
        log.info("vllm starting pid=%d url=%s log=%s", self.proc.pid, self.url, self.log_path)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _log_tail(self, n: int = 15) -> str:
        try:
            lines = Path(self.log_path or "").read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def _wait_healthy(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            rc = self.proc.poll()
            if rc is not None:
                raise EngineStartError(
                    f"vLLM exited with code {rc} during start-up (log {self.log_path}):\n{self._log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0, headers=engine_headers()).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise EngineStartError(
            f"vLLM did not become healthy within {self.startup_timeout_s:.0f} s (log {self.log_path}):\n"
            f"{self._log_tail()}"
        )

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, wait: bool = True) -> None:
        """SIGKILL the whole process group at once (crash simulation, forced exit), its leader
        dead or not; ``wait=False`` does not reap it (a last-resort hook that must not block)."""
        if self.proc is None:
            return
        with contextlib.suppress(OSError):  # the group id is the leader's pid (own session)
            os.killpg(self.proc.pid, signal.SIGKILL)
        if wait:
            self.proc.wait()

    def stop(self, timeout_s: float = 15.0) -> None:
        """End the whole process group: SIGTERM, SIGKILL after ``timeout_s``, then check /proc.
        Runs even when the leader is gone already, as long as any process of the group lives."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        if self.proc.poll() is not None and not group_members(pgid):
            return
        left = end_group(pgid, timeout_s)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5.0)  # reap the leader
        if left:
            log.error("vllm url=%s: processes %s of its group outlived SIGKILL", self.url, left)
        log.info("vllm stopped url=%s", self.url)

    def __enter__(self) -> VLLMServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_together(servers: Sequence[VLLMServer], logs: Path) -> None:
    """Start every server at once, each start waiting on its own engine (two engines loading
    side by side take about as long as one on a loaded host); ``EngineStartError`` naming where
    the logs are when any did not come up."""
    threads = [threading.Thread(target=s.start) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if not all(s.alive() for s in servers):
        raise EngineStartError(f"an engine did not start (logs in {logs})")
