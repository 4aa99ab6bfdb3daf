"""Two Ray nodes on one host, each in its own network namespace (``rollout.netns``): the head
runs ``rollyard train`` (gateway + trainer rank 0), the worker node runs the engine, every agent
and sandbox and, in the first test, trainer rank 1 (a Ray actor). Then the worker machine is lost
during a step: the run stops with a clear error and resumes from its checkpoint, and the ledger
shows no group lost or trained twice.

``make test-cluster`` (marker ``cluster``): a few minutes, most of it two engine start-ups.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rollyard.core.errors import ConfigError
from rollyard.core.tables import read_parquet
from rollyard.rollout.netns import HEAD_IP, WORKER_IP, NetnsPair, TwoNodeRay
from rollyard.rollout.rundir import RunDir

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.engine]

STEPS = 3
RUN_S = 900  # one run on a loaded 2-core host, engine start-up included


def _usable() -> str | None:
    try:
        NetnsPair().close()
    except (ConfigError, OSError) as e:  # no unshare/ip, or user namespaces switched off
        return str(e)
    return None


@pytest.fixture(scope="module")
def cluster() -> Iterator[TwoNodeRay]:
    pytest.importorskip("ray")
    if why := _usable():
        pytest.skip(f"no network namespaces here: {why}")
    with TwoNodeRay(worker_cpus=3) as c:  # the engine, two rollout workers, a trainer rank
        yield c


def _train(cluster: TwoNodeRay, run: RunDir, *args: str) -> subprocess.Popen[bytes]:
    """``rollyard train`` on the head node; its stderr in RUN_DIR/../stderr-N.txt."""
    n = len(list(run.root.parent.glob("stderr-*.txt")))
    err = open(run.root.parent / f"stderr-{n}.txt", "wb")  # noqa: SIM115 - the child writes it
    rollyard = str(Path(sys.executable).parent / "rollyard")
    env = {"PYTHONPATH": os.environ.get("PYTHONPATH", ""), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    return cluster.popen("head", [rollyard, "train", *args], stdout=subprocess.DEVNULL, stderr=err, env=env)


def _new_run(
    cluster: TwoNodeRay, run: RunDir, checkpoint_every: int, **extra: object
) -> subprocess.Popen[bytes]:
    over = {
        **extra,
        "run.steps": STEPS,
        "run.checkpoint_every": checkpoint_every,
        "run.progress": "false",
        "ray.workers": 2,
        "gateway.host": "0.0.0.0",
        "gateway.advertise": HEAD_IP,  # what the worker node dials
        "publish.host": HEAD_IP,  # where its engine joins the trainer's weight group
        "engine.startup_timeout_s": 400,
    }
    sets = [a for k, v in over.items() for a in ("--set", f"{k}={v}")]
    return _train(cluster, run, "quick", "--run-dir", str(run.root), "--ray", cluster.address, *sets)


def _stderr(run: RunDir) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted(run.root.parent.glob("stderr-*.txt")))


def _wait(proc: subprocess.Popen[bytes], run: RunDir) -> int:
    try:
        return proc.wait(timeout=RUN_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the run did not end in {RUN_S} s:\n{_stderr(run)[-3000:]}")


def _assert_ledger(run: RunDir, groups_per_step: int) -> set[str]:
    """Every step trained its groups once; no group number skipped (lost) or trained twice."""
    rows = run.read_metrics()
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    trained = [g for r in rows for g in r["groups"]]
    assert len(trained) == len(set(trained)) == STEPS * groups_per_step, "a group was trained twice"
    ledger = torch.load(run.checkpoint / "state.pt", weights_only=False)["extra_state"]["ledger"]
    numbers = {int(n) for n in ledger["trained"]}
    assert {f"g{n:06d}" for n in numbers} == set(trained)
    ended = numbers | {int(n) for n in ledger["dropped"]}
    assert ended == set(range(max(ended) + 1)), "a group number was skipped (lost)"
    assert not ledger["dropped"], f"groups dropped: {ledger['dropped']}"
    return set(trained)


def _assert_on_worker(run: RunDir) -> None:
    """Every program's agent and sandbox ran on the worker node; the engine served from it."""
    for step in range(1, STEPS + 1):
        trajs = read_parquet(run.trajectory_file(step))
        assert trajs and {t.outcome.details.get("node") for t in trajs if t.outcome} == {WORKER_IP}
        assert all(t.num_turns >= 1 for t in trajs)  # each reached the engine through the gateway
    log = (run.logs / "run.log").read_text()
    engines = re.findall(r"vllm on ray engine0 url=http://([\d.]+):\d+", log)
    assert engines and set(engines) == {WORKER_IP}, engines
    assert f"advertised=http://{HEAD_IP}:" in log  # what the workers were handed


def test_three_steps_with_engine_agents_and_sandboxes_on_the_worker_node(
    cluster: TwoNodeRay, tmp_path: Path
) -> None:
    run = RunDir(tmp_path / "run")
    t0 = time.monotonic()
    # two trainer ranks: rank 1 is a Ray actor, which only the worker node has room for
    rc = _wait(_new_run(cluster, run, checkpoint_every=10, **{"trainer.world_size": 2}), run)
    assert rc == 0, _stderr(run)[-3000:]
    print(f"two-node run: {STEPS} steps in {time.monotonic() - t0:.0f} s")
    _assert_ledger(run, groups_per_step=2)
    _assert_on_worker(run)
    assert all(r["train_ranks"] == 2 and r["train_ranks_on_ray"] == 1.0 for r in run.read_metrics())
    log = (run.logs / "run.log").read_text()
    assert f"placement=ray rendezvous={HEAD_IP}:" in log  # rank 0 on the head, at its address
    assert f"trainer rank actors joined nodes=['{WORKER_IP}']" in log  # rank 1 from the worker node
    weights = [r["policy_version"] for r in run.read_metrics()]
    assert weights == [1, 2, 3]  # each step's weights reached the engine on the other node


def test_losing_the_worker_node_stops_the_run_and_resume_loses_no_group(
    cluster: TwoNodeRay, tmp_path: Path
) -> None:
    run = RunDir(tmp_path / "run")
    proc = _new_run(cluster, run, checkpoint_every=1)
    deadline = time.monotonic() + RUN_S
    while not run.read_metrics():  # step 1 trained and checkpointed; step 2's groups in flight
        assert proc.poll() is None, _stderr(run)[-3000:]
        assert time.monotonic() < deadline, "no step finished in time"
        time.sleep(0.5)
    cluster.kill_worker()
    t_kill = time.monotonic()
    rc = _wait(proc, run)
    stopped_s = time.monotonic() - t_kill
    err = _stderr(run)
    assert rc != 0 and "rollout worker" in err and "--resume" in err, err[-3000:]
    done = len(run.read_metrics())
    assert done < STEPS, "the run finished before the node was lost: nothing was tested"
    print(f"worker node lost after step 1; the run stopped {stopped_s:.0f} s later at step {done}")
    cluster.start_worker()  # the machine comes back
    rc = _wait(_train(cluster, run, "--resume", str(run.root)), run)
    assert rc == 0, _stderr(run)[-3000:]
    _assert_ledger(run, groups_per_step=2)
    _assert_on_worker(run)
