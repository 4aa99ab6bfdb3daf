"""The trainer side of memory publication: buckets, their plan, and a real gloo link."""

from __future__ import annotations

import threading

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rollyard.core.errors import TrainError
from rollyard.rollout.config import PublishConfig
from rollyard.train.weight_stream import GlooLink, model_weights, pack


def unpack(plan: dict, flat: torch.Tensor) -> dict[str, torch.Tensor]:
    """What the worker extension does with a received bucket."""
    return {
        name: flat[off : off + torch.Size(shape).numel()].view(*shape) for name, shape, off in plan["tensors"]
    }


@given(
    shapes=st.lists(st.lists(st.integers(1, 6), min_size=1, max_size=3), min_size=1, max_size=12),
    halves=st.lists(st.booleans(), min_size=12, max_size=12),
    bucket=st.integers(4, 400),
)
def test_buckets_hold_every_tensor_once_within_the_size_and_one_dtype(
    shapes: list[list[int]], halves: list[bool], bucket: int
) -> None:
    g = torch.Generator().manual_seed(0)
    weights = [
        (f"w{i}", torch.randn(s, generator=g).to(torch.float16 if halves[i] else torch.float32))
        for i, s in enumerate(shapes)
    ]
    buckets = pack(iter(weights), bucket)
    got: dict[str, torch.Tensor] = {}
    for b in buckets:
        flat, plan = b.flat(), b.plan()
        assert flat.dtype == b.dtype and plan["numel"] == flat.numel()
        assert len(b.tensors) == 1 or flat.numel() * flat.element_size() <= bucket
        got.update(unpack(plan, flat))
    assert list(got) == [n for n, _ in weights]
    assert all(torch.equal(got[n], t) for n, t in weights)


def test_non_finite_weights_are_refused_before_anything_is_sent() -> None:
    with pytest.raises(TrainError, match="non-finite"):
        pack(iter([("a", torch.ones(3)), ("b", torch.tensor([1.0, float("inf")]))]), 1 << 20)


def test_a_tied_weight_is_sent_once() -> None:
    emb = torch.nn.Embedding(10, 4)
    model = torch.nn.Module()
    model.embed = emb
    model.head = torch.nn.Linear(4, 10, bias=False)
    model.head.weight = emb.weight
    assert [n for n, _ in model_weights(model)] == ["embed.weight"]


def test_a_gloo_link_delivers_the_bytes() -> None:
    """Both ends of a real two-rank gloo group: the trainer's link and a receiver like the worker's."""
    import datetime

    import torch.distributed as dist

    link = GlooLink("127.0.0.1", timeout_s=30)
    port = link.listen()
    got: list[torch.Tensor] = []

    def worker() -> None:
        t = datetime.timedelta(seconds=30)
        store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=t)
        pg = dist.ProcessGroupGloo(dist.PrefixStore("rollyard-weights", store), 1, 2, t)
        buf = torch.empty(1000)
        pg.broadcast(buf, 0).wait()
        got.append(buf)

    th = threading.Thread(target=worker)
    th.start()
    link.connect()
    sent = torch.randn(1000)
    link.send(sent)
    th.join(30)
    assert torch.equal(got[0], sent)


def test_memory_is_the_default_publish_mode() -> None:
    assert PublishConfig().mode == "memory"
