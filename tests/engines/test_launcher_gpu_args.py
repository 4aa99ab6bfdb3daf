"""The launcher's engine command on a CUDA host versus a CPU host (GPU plumbing; no GPU here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.engines import launcher


def test_on_a_cuda_host_the_engine_is_bf16_with_kv_by_memory_fraction_and_tensor_parallel(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """GPU plumbing only (no GPU here): the command a CUDA node's engine would run."""
    cpu = launcher.VLLMServer(tmp_path, kv_tokens=4096, max_model_len=1024).command()
    assert cpu[cpu.index("--dtype") + 1] == "float32" and "--num-gpu-blocks-override" in cpu
    assert "--tensor-parallel-size" not in cpu and "--gpu-memory-utilization" not in cpu
    monkeypatch.setattr(launcher, "has_cuda_gpu", lambda: True)
    gpu = launcher.VLLMServer(
        tmp_path, kv_tokens=4096, max_model_len=1024, tensor_parallel_size=2, gpu_memory_utilization=0.8
    ).command()
    assert gpu[gpu.index("--dtype") + 1] == "bfloat16" and "--num-gpu-blocks-override" not in gpu
    assert gpu[gpu.index("--tensor-parallel-size") + 1] == "2"
    assert gpu[gpu.index("--gpu-memory-utilization") + 1] == "0.8"
