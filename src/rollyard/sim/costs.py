"""What a cluster run pays outside the engines' steps: the gateway's CPU per request, the
trainer's step, and the publication of each new policy version. Optional sections of an
engine profile; a profile without them charges nothing there (the simulator as it was).

Gateway: a request costs ``base_s + per_prompt_token_s * prompt + per_new_token_s * new`` of
CPU on its way in (parse, render, schedule; ``new``: the tokens the request adds to its
conversation, which the gateway renders and tokenizes now, a first turn's whole prompt) and
``base_s`` split evenly with it plus ``per_output_token_s`` (or, when clients stream,
``per_stream_token_s``) per generated token on its way back (decode, record, journal, answer).
The coefficients come from ``rollyard sim calibrate --gateway``, which times the real gateway
in front of the canned engine: nothing here assumes how the cost grows with history, so a
gateway whose cost stops growing calibrates to a small ``per_prompt_token_s``. ``shards``
gateway processes of ``cores_per_shard`` cores each are the servers; a program stays on one
shard (the gateway shards by program).

Trainer: a step trains the batch's tree-merged tokens (a group's task prompt once, each
member's own tokens after it) in ``6 x params x tokens / (gpus x peak_flops x mfu)`` seconds
(forward 2, backward 4 FLOPs per parameter and token).

Publication: the trainer stages the new weights (``disk``: written at ``disk_write_bw``;
``memory``: nothing staged), then every engine stops scheduling (the version fence) while it
takes them (``disk``: read at ``disk_read_bw`` per engine, all engines together at most
``storage_bw``; ``memory``: sent at ``memory_bw`` per engine, in parallel) and swaps them in
(``swap_s``). The new version is live when the fence lifts.
"""

from __future__ import annotations

import math
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["GatewayCost", "PublishCost", "PublishMode", "TrainerCost", "shards_needed"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GatewayCost(_Model):
    source: str = ""  # the calibration it came from
    base_s: float = Field(ge=0)  # CPU seconds per request, whatever its size
    per_prompt_token_s: float = Field(default=0.0, ge=0)  # per token of the request's prompt (its history)
    per_new_token_s: float = Field(default=0.0, ge=0)  # per token the request adds (rendered now)
    per_output_token_s: float = Field(default=0.0, ge=0)  # per generated token, answered whole
    per_stream_token_s: float = Field(default=0.0, ge=0)  # per generated token, streamed
    stream: bool = False  # whether the clients stream (agent CLIs do)
    shards: int = Field(default=1, ge=1)
    cores_per_shard: int = Field(default=1, ge=1)

    @property
    def servers(self) -> int:
        return self.shards * self.cores_per_shard

    def in_s(self, prompt_tokens: int, new_tokens: int | None = None) -> float:
        """CPU on the way in: half the fixed cost, the prompt's and its new tokens' (all of them
        when ``new_tokens`` is not given: a first turn)."""
        new = prompt_tokens if new_tokens is None else new_tokens
        return 0.5 * self.base_s + self.per_prompt_token_s * prompt_tokens + self.per_new_token_s * new

    def out_s(self, output_tokens: int) -> float:
        """CPU on the way back: the other half, and the answer's tokens."""
        per = self.per_stream_token_s if self.stream else self.per_output_token_s
        return 0.5 * self.base_s + per * output_tokens

    def request_s(self, prompt_tokens: int, output_tokens: int, new_tokens: int | None = None) -> float:
        return self.in_s(prompt_tokens, new_tokens) + self.out_s(output_tokens)


def shards_needed(work_s: float, makespan_s: float, cores_per_shard: int, target: float = 0.7) -> int:
    """The fewest shards whose cores, busy ``work_s`` CPU seconds over ``makespan_s``, are at most
    ``target`` utilised: ``ceil(work / (target x cores x makespan))``."""
    if makespan_s <= 0 or work_s <= 0:
        return 1
    return max(1, math.ceil(work_s / (target * cores_per_shard * makespan_s) - 1e-9))


class TrainerCost(_Model):
    params: float = Field(gt=0)  # the policy's parameters
    gpus: int = Field(default=8, ge=1)
    peak_flops: float = Field(gt=0)  # per GPU, dense, in the training dtype
    mfu: float = Field(gt=0, le=1)  # model FLOPs utilisation the trainer reaches (explicit: an assumption)

    def step_s(self, tokens: int) -> float:
        """6 x params x tokens over the GPUs' delivered FLOP/s."""
        return 6.0 * self.params * tokens / (self.gpus * self.peak_flops * self.mfu)


class PublishMode(StrEnum):
    DISK = "disk"
    MEMORY = "memory"


class PublishCost(_Model):
    mode: PublishMode = PublishMode.DISK
    bytes: float = Field(gt=0)  # the weights an engine takes (bf16: 2 x params)
    disk_write_bw: float = Field(default=2e9, gt=0)  # bytes/s the trainer writes
    disk_read_bw: float = Field(default=2e9, gt=0)  # bytes/s one engine reads
    storage_bw: float | None = Field(default=None, gt=0)  # bytes/s to all engines together; None: no limit
    memory_bw: float = Field(default=25e9, gt=0)  # bytes/s into one engine, trainer to engines in parallel
    swap_s: float = Field(default=0.05, ge=0)  # the engine's own switch once it holds the bytes

    def stage_s(self) -> float:
        """The trainer's part before the fence: writing the weights (disk), nothing (memory)."""
        return 0.0 if self.mode == PublishMode.MEMORY else self.bytes / self.disk_write_bw

    def fence_s(self, engines: int) -> float:
        """How long every engine stops scheduling while it takes the new weights."""
        if self.mode == PublishMode.DISK:
            take = self.bytes / self.disk_read_bw
            if self.storage_bw is not None:
                take = max(take, engines * self.bytes / self.storage_bw)
        else:
            take = self.bytes / self.memory_bw
        return take + self.swap_s

    def publish_s(self, engines: int) -> float:
        return self.stage_s() + self.fence_s(engines)
