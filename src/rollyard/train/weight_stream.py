"""The trainer's side of in-memory publication: its weights as buckets, sent over gloo.

``model_weights`` is the default source of ``(name, tensor)`` pairs. With FSDP2 each DTensor's
``full_tensor()`` is a collective every trainer rank must join in the same order: a multi-rank
trainer passes its own iterator factory to the publisher (``WeightPublisher(weights=...)``) and
has the other ranks walk the same state dict at the same time (the lead's hook; rank 0 alone
sends). ``pack`` groups consecutive tensors of one dtype into flat buckets of at most
``bucket_bytes`` (a tensor larger than that travels alone), so each bucket is one contiguous
gloo broadcast and the receiver needs only the small plan (name, shape, offset) to slice it.

``GlooLink`` is one two-rank group, trainer rank 0 and one engine worker rank 1: one group per
engine rather than one over all engines, because gloo cannot abort a collective. Over one group
a dead engine would stall or fail every engine's transfer; over its own it fails alone and
the others finish. The price is one send per engine (on one host, a memory copy each).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from rollyard.core.errors import TrainError
from rollyard.engines.gloo_pair import gloo_pair

WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]


def model_weights(model: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """The model's state dict as full tensors; a tensor tied to one already given (the tied
    ``lm_head``) is skipped, as ``save_pretrained`` skips it."""
    seen: set[int] = set()
    for name, t in model.state_dict().items():
        full = getattr(t, "full_tensor", None)
        if full is not None:  # an FSDP2 shard: gathering it is a collective (see the docstring)
            t = full()
        elif t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        yield name, t.detach()


@dataclass
class Bucket:
    dtype: torch.dtype
    tensors: list[tuple[str, torch.Tensor]] = field(default_factory=list)
    numel: int = 0

    def plan(self) -> dict[str, Any]:
        """What the receiver needs before the bytes: dtype, size, and where each tensor lies."""
        entries, offset = [], 0
        for name, t in self.tensors:
            entries.append([name, list(t.shape), offset])
            offset += t.numel()
        return {"dtype": str(self.dtype).removeprefix("torch."), "numel": self.numel, "tensors": entries}

    def flat(self) -> torch.Tensor:
        return torch.cat([t.reshape(-1) for _, t in self.tensors])


def pack(weights: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int) -> list[Bucket]:
    """Consecutive same-dtype tensors in buckets of at most ``bucket_bytes``; refuses non-finite
    weights (as the disk path does) before anything is sent."""
    buckets: list[Bucket] = []
    for name, t in weights:
        if t.is_floating_point() and not torch.isfinite(t).all():
            raise TrainError(f"refusing to publish non-finite weights ({name})")
        t = t.contiguous()
        size = t.numel() * t.element_size()
        last = buckets[-1] if buckets else None
        if last is None or last.dtype != t.dtype or (last.numel * t.element_size() + size > bucket_bytes):
            last = Bucket(t.dtype)
            buckets.append(last)
        last.tensors.append((name, t))
        last.numel += t.numel()
    return buckets


class GlooLink:
    """The trainer's end of one engine's two-rank gloo group: ``listen`` opens its store on a
    free port (the engine is told it), ``connect`` blocks until the engine's worker joins (its
    join RPC runs concurrently); run ``connect`` and ``send`` in a thread."""

    def __init__(self, host: str, timeout_s: float) -> None:
        self.host = host
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self._store: dist.TCPStore | None = None
        self._pg: Any = None

    def listen(self) -> int:
        self._store = dist.TCPStore(self.host, 0, 2, True, timeout=self.timeout, wait_for_workers=False)
        return int(self._store.port)

    def connect(self) -> None:
        if self._store is None:
            raise TrainError("listen before connect")
        self._pg = gloo_pair(self._store, 0, self.timeout, self.host)

    @property
    def ready(self) -> bool:
        return self._pg is not None

    def send(self, flat: torch.Tensor) -> None:
        if self._pg is None:
            raise TrainError("the weight group is not open")
        self._pg.broadcast(flat, 0).wait()

    def close(self) -> None:
        self._pg = self._store = None
