"""The vLLM plugin's fix, checked in a fresh interpreter the way an engine process loads it."""

from __future__ import annotations

import json
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

CHECK = """
import torch
from vllm.plugins import load_general_plugins
from vllm.platforms import current_platform
load_general_plugins()
current_platform.register_triton_kernel_overrides()
from vllm.v1.sample.rejection_sampler import expand_batch_to_tokens
t = expand_batch_to_tokens(torch.tensor([0.7, 0.0, 1.3]), torch.tensor([3, 5, 6], dtype=torch.int32), 6,
                           replace_from=0, replace_to=1)
k = expand_batch_to_tokens(torch.tensor([5, 7], dtype=torch.int32), torch.tensor([1, 4]), 4)
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
none = apply_top_k_top_p(torch.empty(0, 8), torch.empty(0, dtype=torch.int32), None)
import json
print(json.dumps([t.tolist(), k.tolist(), list(none.shape)]))
"""


def test_vllm_finds_the_plugin_entry_point() -> None:
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("rollyard") == "rollyard.engines.vllm_plugin:register"


def test_draft_tokens_get_their_requests_sampling_parameters_on_cpu() -> None:
    """Temperatures and top-k spread over draft tokens as vLLM's Triton kernel would (without
    the plugin the CPU stand-in leaves the buffer uninitialised), and a step with no draft
    token at all passes top-k masking instead of raising."""
    pytest.importorskip("vllm")
    out = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    temps, top_k, empty = json.loads(out.stdout.strip().splitlines()[-1])
    assert temps == pytest.approx([0.7, 0.7, 0.7, 1.0, 1.0, 1.3])
    assert top_k == [5, 7, 7, 7]
    assert empty == [0, 8]  # a verification step with no drafts and top-k set (engine died)


def test_the_fix_keeps_the_buffer_dtype_and_empty_requests() -> None:
    torch = pytest.importorskip("torch")
    from rollyard.engines.vllm_plugin import expand_kernel_impl

    out = torch.empty(3, dtype=torch.float32)
    expand_kernel_impl(out, torch.tensor([0.5, 0.25, 2.0]), torch.tensor([2, 2, 3]), 0, 1)
    assert out.tolist() == [0.5, 0.5, 2.0]
