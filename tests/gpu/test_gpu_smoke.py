"""GPU smoke: bf16 training with the flex tree mask, flex merged = unmerged, FSDP2 on one GPU, and the
chunked head's peak memory. Untested until a GPU run: quote its output when one is available."""

from __future__ import annotations

import random
import socket

import pytest
import torch

from rollyard.core import Sample
from rollyard.train import TrainConfig, Trainer, build_model, pack_samples, set_attention
from rollyard.train.logprobs import chunked_logprobs, sample_logprobs
from rollyard.train.objective import LossConfig
from rollyard.train.plan import model_config
from rollyard.train.step import forward_backward

CUDA = torch.device("cuda")


def _group(
    vocab: int, prompt: int = 96, completions: int = 4, completion: int = 48, seed: int = 0
) -> list[Sample]:
    """A GRPO group whose completions share one length (few distinct shapes: few flex compilations)."""
    rng = random.Random(seed)
    p = [rng.randrange(vocab) for _ in range(prompt)]
    out = []
    for _ in range(completions):
        ids = p + [rng.randrange(vocab) for _ in range(completion)]
        n = len(ids)
        out.append(
            Sample(
                token_ids=ids,
                loss_mask=[0] * prompt + [1] * completion,
                logprobs=[0.0] * prompt + [-rng.random() * 3 - 8 for _ in range(completion)],
                advantages=[rng.gauss(0, 1)] * n,
            )
        )
    return out


def _smollm2_bf16() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(model_config("smollm2-135m")).to(
        device=CUDA, dtype=torch.bfloat16
    )


def test_bf16_train_step_of_smollm2_shape_with_the_flex_tree_mask() -> None:
    model = _smollm2_bf16()
    trainer = Trainer(model, TrainConfig(lr=1e-3, loss=LossConfig(kind="sft")))
    assert trainer.impl == "flex_attention"
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    metrics = trainer.train_step(_group(model.config.vocab_size))
    print(f"bf16 smollm2-shape step: {metrics}")
    assert metrics["skipped"] == 0 and metrics["grad_norm"] > 0
    assert metrics["merged_unmerged_ratio"] < 0.75, "the group was not merged into a tree"
    moved = [n for n, p in model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert "model.layers.0.self_attn.q_proj.weight" in moved and "model.embed_tokens.weight" in moved


def _logprobs_and_grads(model: torch.nn.Module, samples: list[Sample], merge: bool, impl: str) -> tuple:
    model.zero_grad(set_to_none=True)
    packed = pack_samples(samples, merge=merge, token_budget=1 << 16 if merge else 1)
    res = forward_backward(
        model, samples, packed, LossConfig(kind="sft"), impl, keep_logprobs=True, logits_chunk=512
    )
    grads = {n: p.grad.detach().float().clone() for n, p in model.named_parameters() if p.grad is not None}
    return res.logprobs, grads


def test_flex_merged_equals_unmerged_bf16_and_fp32() -> None:
    # bf16, SmolLM2 shape: logprobs within bf16 rounding
    model = _smollm2_bf16()
    set_attention(model, "flex_attention")
    samples = _group(model.config.vocab_size, seed=1)
    merged, _ = _logprobs_and_grads(model, samples, True, "flex_attention")
    unmerged, _ = _logprobs_and_grads(model, samples, False, "flex_attention")
    diffs = torch.cat([(merged[i] - unmerged[i]).abs().float() for i in unmerged])
    print(f"bf16 flex merged vs unmerged: max {float(diffs.max()):.4f} mean {float(diffs.mean()):.5f}")
    assert float(diffs.max()) < 0.25 and float(diffs.mean()) < 0.03
    # fp32, the small test model: logprobs and every gradient (flex backward) as on CPU
    small = build_model("test", seed=1).to(CUDA)
    set_attention(small, "flex_attention")
    samples = _group(small.config.vocab_size, prompt=40, completion=24, seed=2)
    lp_m, g_m = _logprobs_and_grads(small, samples, True, "flex_attention")
    lp_u, g_u = _logprobs_and_grads(small, samples, False, "flex_attention")
    for i in lp_u:
        assert float((lp_m[i] - lp_u[i]).abs().max()) < 1e-4
    for name, g in g_u.items():
        assert float((g_m[name] - g).abs().max()) <= 1e-3 * float(g.abs().max()) + 1e-7, name


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_fsdp2_on_one_gpu_matches_a_plain_replica() -> None:
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    samples = _group(512, prompt=30, completion=12, seed=3)
    models = {}
    for kind in ("plain", "fsdp2"):
        model = build_model("test", seed=7).to(CUDA)
        set_attention(model, "rollyard_tree")
        models[kind] = model
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    try:
        sharded = models["fsdp2"]
        for layer in sharded.model.layers:
            fully_shard(layer)
        fully_shard(sharded)
        for model in models.values():
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            for _ in range(2):
                opt.zero_grad(set_to_none=True)
                packed = pack_samples(samples)
                forward_backward(
                    model, samples, packed, LossConfig(kind="sft"), "rollyard_tree", logits_chunk=64
                )
                opt.step()
        full = {n: p.full_tensor() for n, p in sharded.named_parameters()}
        ref = dict(models["plain"].named_parameters())
        worst = max(float((full[n] - ref[n]).abs().max()) for n in ref)
        print(f"fsdp2 (1 GPU) vs plain after 2 steps: max weight diff {worst:.2e}")
        assert worst < 1e-5
        assert not torch.equal(
            ref["model.embed_tokens.weight"], build_model("test", seed=7).to(CUDA).model.embed_tokens.weight
        )
    finally:
        dist.destroy_process_group()


def test_chunked_head_peak_memory_is_an_eighth_of_the_full_logits() -> None:
    from rollyard.bench.trainer_scale import HIDDEN, VOCAB, _group_forest

    mb = _group_forest(4096, 1, VOCAB)
    gen = torch.Generator(device=CUDA).manual_seed(0)
    hidden = torch.randn(mb.num_tokens, HIDDEN, device=CUDA, generator=gen).requires_grad_()
    head = (torch.randn(VOCAB, HIDDEN, device=CUDA, generator=gen) * 0.02).requires_grad_()
    peaks, losses = {}, {}
    for variant in ("full", "chunked"):
        hidden.grad = head.grad = None
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        if variant == "full":
            lps, _ = sample_logprobs(torch.nn.functional.linear(hidden, head), mb)
        else:
            lps, _ = chunked_logprobs(hidden, head, mb, chunk=TrainConfig().logits_chunk)
        loss = torch.stack([lp.sum() for lp in lps]).sum()
        loss.backward()
        torch.cuda.synchronize()
        peaks[variant] = torch.cuda.max_memory_allocated() - base
        losses[variant] = float(loss.detach())
        del lps, loss
    ratio = peaks["chunked"] / peaks["full"]
    gb = {k: round(v / 1e9, 3) for k, v in peaks.items()}
    print(f"4096 tokens, vocab {VOCAB}: peak GB {gb}, chunked / full {ratio:.3f}")
    assert losses["chunked"] == pytest.approx(losses["full"], rel=1e-4)
    assert ratio <= 1 / 8
