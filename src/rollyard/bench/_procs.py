"""The benches' processes: a vLLM engine, a ``rollyard gateway``, the canned engine and the bare
relay, each on a free port, started, waited for by name and stopped; and a process's CPU time.

``rollyard bench gateway`` started these first; the sim, soak and agents benches (and tests that
drive a real gateway process) use the same ones.

Each runs in a session of its own, as a service started from its own shell (or unit) does, and
as the vLLM launcher already starts the engine. Why it matters: with the kernel's autogroup
scheduling (on by default), CPU time is shared between sessions first; a gateway in the bench's
session shared one slice with the bench's own clients (256 of them in the soak), while the engine
had a slice of its own.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from rollyard.core.net import free_port

ADMIN = "bench-admin"


def _cpu_seconds(pid: int) -> float:
    """CPU seconds ``pid``'s live threads have run, to the nanosecond (``schedstat``).

    Why not ``/proc/PID/stat``: its user and system times count in 10 ms ticks, and a bench wave of
    32 requests costs 40-60 ms, so one tick moved a point by 20%. The price: a thread that ended
    between two reads takes its time with it; the gateway's threads are pools that live as long as
    it does. Falls back to the ticks where ``schedstat`` is missing (a kernel without it)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                total += int((task / "schedstat").read_text().split()[0])
    except FileNotFoundError:
        total = -1
    if total > 0:
        return total / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pin(pid: int, cores: str) -> None:
    """Every thread of ``pid`` onto ``cores`` (``taskset -a -cp``)."""
    subprocess.run(["taskset", "-a", "-cp", cores, str(pid)], check=True, capture_output=True)


@contextlib.contextmanager
def pinned_here(cores: set[int]) -> Iterator[None]:
    """This thread on ``cores`` for the block, its affinity restored after."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _host_busy_seconds() -> float:
    """CPU seconds every core of the host has spent busy since boot (``/proc/stat``: all but
    idle and iowait), so a run's busy cores are the difference over its wall time."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def _engine(
    kv_tokens: int = 16384,
    startup_timeout_s: float = 300.0,
    max_model_len: int = 2048,
    model_dir: Path | None = None,
    autogroup_nice: int = 0,
) -> Iterator[tuple[str, Path]]:
    """The benches' engine: the tiny model (or ``model_dir``) on a fresh local vLLM, or the one
    named by ``ROLLYARD_BENCH_ENGINE_URL`` + ``ROLLYARD_BENCH_MODEL_DIR`` (then ``kv_tokens`` is
    its own). ``autogroup_nice``: the nice value of the engine's session, its scheduling group (see
    above; a plain nice only ranks processes inside one session)."""
    url, model = os.environ.get("ROLLYARD_BENCH_ENGINE_URL"), os.environ.get("ROLLYARD_BENCH_MODEL_DIR")
    if url and model and model_dir is None:
        yield url, Path(model)
        return
    from rollyard.engines.launcher import VLLMServer
    from rollyard.engines.tiny_model import create_model

    with tempfile.TemporaryDirectory() as d:
        model_dir = model_dir or create_model(Path(d) / "tiny", seed=0, size="tiny")
        with VLLMServer(
            model_dir,
            kv_tokens=kv_tokens,
            max_model_len=max_model_len,
            served_name="tiny",
            startup_timeout_s=startup_timeout_s,
        ) as server:
            if autogroup_nice and server.proc is not None:
                with contextlib.suppress(OSError):  # a kernel without autogroup: as it is
                    Path(f"/proc/{server.proc.pid}/autogroup").write_text(str(autogroup_nice))
            yield server.url, model_dir


def _healthy(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health").status_code == 200
    return False


def _listening(port: int) -> bool:
    import socket

    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def _wait_until(ready: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll ``ready`` until it holds; a process that never comes up fails here, by name."""
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not come up within {timeout_s:.0f} s")
        time.sleep(0.1)


@contextlib.contextmanager
def _gateway(
    engine_url: str | list[str],
    model_dir: Path,
    extra: list[str] | None = None,
    *,
    model_name: str = "tiny",
    capacity: int | None = 1024,
) -> Iterator[tuple[str, int]]:
    """A ``rollyard gateway`` process on a free port: (url, pid). ``extra`` adds CLI flags;
    ``capacity`` None keeps the gateway's default. Its log is kept aside and shown if it dies
    before it is up; one that does not stop (requests still held) is killed."""
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-m", "rollyard", "gateway"]
        for url in [engine_url] if isinstance(engine_url, str) else engine_url:
            cmd += ["--engine", url]
        cmd += ["--model-dir", str(model_dir), "--port", str(port), "--state-dir", state]
        cmd += ["--model-name", model_name, *([] if capacity is None else ["--capacity", str(capacity)])]
        env = {**os.environ, "ROLLYARD_ADMIN_TOKEN": ADMIN}
        log = Path(state) / "gateway.log"
        with log.open("wb") as err:
            proc = subprocess.Popen(
                [*cmd, *(extra or [])], env=env, stdout=subprocess.DEVNULL, stderr=err, start_new_session=True
            )
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _up(proc, log) and _healthy(url), "the gateway")
            yield url, proc.pid
        finally:
            _stop(proc)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """SIGTERM a bench's gateway; SIGKILL one that does not stop (requests still held)."""
    proc.terminate()
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout_s)


def _up(proc: subprocess.Popen[bytes], log: Path) -> bool:
    """True while ``proc`` runs; its log's tail as the error once it has exited."""
    if proc.poll() is not None:
        tail = log.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"the gateway exited with {proc.returncode} before it was up:\n{tail}")
    return True


@contextlib.contextmanager
def _canned(
    max_model_len: int = 2048, token_interval_ms: float = 20.0, cores: str | None = None
) -> Iterator[tuple[str, Path]]:
    """``rollyard.engines.canned`` in its own process (on ``cores`` when given), and a tiny
    model for the tokenizer."""
    from rollyard.engines.tiny_model import create_model

    port = free_port()
    cmd = [sys.executable, "-m", "rollyard.engines.canned", "--port", str(port)]
    cmd += ["--max-model-len", str(max_model_len), "--token-interval-ms", str(token_interval_ms)]
    with tempfile.TemporaryDirectory() as d:
        model_dir = create_model(Path(d) / "tiny", seed=0, size="tiny")
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            _wait_until(lambda: _healthy(url), "the canned engine")
            if cores is not None:
                pin(proc.pid, cores)
            yield url, model_dir
        finally:
            proc.terminate()
            proc.wait(15)


@contextlib.contextmanager
def _listener(cmd: list[str], port: int, what: str) -> Iterator[tuple[str, int]]:
    """``cmd`` in its own process, once it listens on ``port``: (url, pid); terminated after."""
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        _wait_until(lambda: _listening(port), what)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(15)


@contextlib.contextmanager
def _floor(engine_url: str) -> Iterator[tuple[str, int]]:
    """``rollyard.bench._floor_proxy`` in its own process: (url, pid)."""
    port = free_port()
    cmd = [sys.executable, "-m", "rollyard.bench._floor_proxy", "--engine", engine_url, "--port", str(port)]
    with _listener(cmd, port, "the floor relay") as served:
        yield served


@contextlib.contextmanager
def _required_floor(engine_url: str, model_dir: Path) -> Iterator[tuple[str, int]]:
    """``rollyard.bench._required_floor`` in its own process, its journal in a temporary
    directory: (url, pid)."""
    port = free_port()
    with tempfile.TemporaryDirectory() as state:
        cmd = [sys.executable, "-m", "rollyard.bench._required_floor", "--engine", engine_url]
        cmd += ["--port", str(port), "--model-dir", str(model_dir), "--state-dir", state]
        with _listener(cmd, port, "the required-work floor") as served:
            yield served
