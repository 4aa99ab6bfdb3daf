"""Every loss x aggregation x correction x mask gives the same loss and gradients however a batch
is split: one or many micro-batches, merged or unmerged trees, one rank or two.

The recorded (behaviour) logprobs are the model's own plus offsets per (sample, chunk) far from
every mask's bound, so IPA's mismatch mask, the corrections and the stability masks all fire
(whole samples emptied included) without a float-rounding difference deciding any of them.
"""

from __future__ import annotations

import functools
import random

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rollyard.core import Sample
from rollyard.rl.corrections import WEIGHT_KINDS, CorrectionKind
from rollyard.rl.masks import StabilityMasks, apply_masks
from rollyard.train import build_model, pack_samples, set_attention
from rollyard.train.objective import BatchTotals, CorrectionConfig, LossConfig
from rollyard.train.step import forward_backward

IMPL = "rollyard_tree"
VOCAB = 512
OFFSETS = [0.0, 0.0, 0.0, 1.2, -1.2, 3.0]  # recorded minus model logprob, per (sample, chunk)


@functools.cache
def _model() -> torch.nn.Module:
    torch.set_num_threads(2)
    model = build_model("test", seed=3)
    set_attention(model, IMPL)
    return model


def _draw_samples(rng: random.Random) -> list[Sample]:
    """Samples sharing prompts and prefixes (so trees merge), with chunked completions."""
    prompts = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))] for _ in range(2)]
    samples = []
    for _ in range(rng.randint(2, 7)):
        ids = list(rng.choice(prompts))
        mask, chunks, adv = [0] * len(ids), [-1] * len(ids), [0.0] * len(ids)
        forced = [0] * len(ids)
        a = rng.gauss(0, 1)
        for k in range(rng.randint(1, 3)):
            n = rng.randint(1, 5)
            ids += [rng.randrange(VOCAB) for _ in range(n)]
            mask += [1] * n
            forced += [int(rng.random() < 0.3)] * n  # a chunk sampled under a tool-call grammar
            chunks += [k] * n
            adv += [a + rng.gauss(0, 0.3) for _ in range(n)]
            if rng.random() < 0.5:  # an observation between chunks: not trained
                obs = rng.randint(1, 3)
                ids += [rng.randrange(VOCAB) for _ in range(obs)]
                mask, chunks, adv = mask + [0] * obs, chunks + [-1] * obs, adv + [0.0] * obs
                forced += [0] * obs
        zeros = [0.0] * len(ids)
        samples.append(
            Sample(
                token_ids=ids, loss_mask=mask, logprobs=zeros, advantages=adv, chunk_ids=chunks, forced=forced
            )
        )
    return samples


def _record(samples: list[Sample], rng: random.Random) -> list[Sample]:
    """Recorded logprobs = the model's own plus a per-chunk offset (a whole sample sometimes)."""
    packed = pack_samples(samples, merge=False, token_budget=10**6)
    res = forward_backward(
        _model(), samples, packed, LossConfig(kind="sft"), IMPL, backward=False, keep_logprobs=True
    )
    out = []
    for i, s in enumerate(samples):
        whole = rng.random() < 0.25
        off = {k: 3.0 if whole else rng.choice(OFFSETS) for k in set(s.chunk_ids or [])}
        lps = [
            float(x) + off[c] if c >= 0 else 0.0
            for x, c in zip(res.logprobs[i].tolist(), s.chunk_ids or [], strict=True)
        ]
        out.append(s.model_copy(update={"logprobs": lps}))
    return out


def _run(
    samples: list[Sample],
    loss: LossConfig,
    correction: CorrectionConfig,
    decoupled: bool,
    shards: list[list[int]],
    **pack: int | bool,
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients summed over ``shards`` (simulated ranks), with the global totals."""
    model = _model()
    model.zero_grad(set_to_none=True)
    live = [s for s in samples if s.num_loss_tokens > 0]
    totals = BatchTotals.of(live)
    total = 0.0
    for shard in shards:
        part = [samples[i] for i in shard if samples[i].num_loss_tokens > 0]
        if not part:
            continue
        packed = pack_samples(part, **pack)  # type: ignore[arg-type]
        res = forward_backward(
            model, part, packed, loss, IMPL, totals=totals, correction=correction, decoupled=decoupled
        )
        assert res.finite
        total += res.loss
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return total, grads


def _assert_same(a: tuple[float, dict], b: tuple[float, dict]) -> None:
    # losses are O(1) sums of terms of either sign: 1e-5 absolute (relative above 1)
    assert abs(a[0] - b[0]) <= 1e-5 * max(1.0, abs(b[0]))
    assert a[1].keys() == b[1].keys()
    for name, g in b[1].items():
        scale = float(g.abs().max())
        assert float((a[1][name] - g).abs().max()) <= 1e-5 * scale + 1e-7, f"grad of {name} differs"


@st.composite
def objectives(draw: st.DrawFn) -> tuple[LossConfig, CorrectionConfig, bool]:
    kind = draw(st.sampled_from(["ppo", "gspo", "ipa", "cispo"]))
    agg = draw(st.sampled_from(["token-mean", "seq-mean", "token-sum-norm"]))
    options = {"norm_const": 40.0} if agg == "token-sum-norm" else {}
    if kind == "ipa" and draw(st.booleans()):
        options["mismatch_bound"] = 0.3
    correction = CorrectionConfig(kind=draw(st.sampled_from(list(CorrectionKind))))
    decoupled = correction.kind in WEIGHT_KINDS or draw(st.booleans())
    return LossConfig(kind=kind, aggregation=agg, options=options), correction, decoupled


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), objectives(), st.integers(1, 30), st.booleans())
def test_loss_and_gradients_do_not_depend_on_the_split(
    seed: int, objective: tuple[LossConfig, CorrectionConfig, bool], budget: int, stability: bool
) -> None:
    rng = random.Random(seed)
    samples = _record(_draw_samples(rng), rng)
    if stability:  # recorded-data masks: applied to the loss masks before the step
        masks = StabilityMasks(positive_only=rng.random() < 0.5, max_negative_tokens=rng.choice([None, 4]))
        samples = apply_masks(
            samples, [rng.random() < 0.2 for _ in samples], masks.model_copy(update={"unrecoverable": True})
        )
    if not any(s.num_loss_tokens for s in samples):
        return
    loss, correction, decoupled = objective
    every = [list(range(len(samples)))]
    whole = _run(samples, loss, correction, decoupled, every, merge=False, token_budget=10**6)
    _assert_same(_run(samples, loss, correction, decoupled, every, merge=False, token_budget=budget), whole)
    _assert_same(_run(samples, loss, correction, decoupled, every, merge=True, token_budget=10**6), whole)
    ranks = [[i for i in range(len(samples)) if i % 2 == r] for r in range(2)]
    rng.shuffle(ranks[0])
    _assert_same(_run(samples, loss, correction, decoupled, ranks, merge=True, token_budget=budget), whole)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31), objectives())
def test_recorded_logprobs_of_forced_tokens_do_not_matter(
    seed: int, objective: tuple[LossConfig, CorrectionConfig, bool]
) -> None:
    """A grammar-forced token's recorded logprob is the constrained distribution's: moving it
    anywhere changes neither the loss nor a gradient (no ratio, correction or mask reads it)."""
    rng = random.Random(seed)
    samples = _record(_draw_samples(rng), rng)
    if not any(f for s in samples for f in s.forced or []):
        return
    moved = [
        s.model_copy(
            update={
                "logprobs": [
                    lp - rng.uniform(1, 9) if f else lp
                    for lp, f in zip(s.logprobs, s.forced or [], strict=True)
                ]
            }
        )
        for s in samples
    ]
    loss, correction, decoupled = objective
    every = [list(range(len(samples)))]
    a = _run(samples, loss, correction, decoupled, every, merge=True, token_budget=10**6)
    b = _run(moved, loss, correction, decoupled, every, merge=True, token_budget=10**6)
    _assert_same(b, a)
