"""Probe whether the tiny model learns to copy, without an engine (see docs/training.md).

    .venv/bin/python scripts/probe_copying.py sft --steps 400      # SFT on lookup demonstrations
    .venv/bin/python scripts/probe_copying.py repeat --steps 400   # "Repeat: w1..w8" on random tokens
    .venv/bin/python scripts/probe_copying.py fixed --length 120 --dilute 64   # one fixed-offset lookup

``sft`` trains on scripted lookup demonstrations (mistake_prob 0.3, run in local sandboxes) and
reports, on 64 clean held-out demonstrations, teacher-forced token accuracy, the greedy
all-correct rate and p_clean (the probability of the clean completion at T=1). ``repeat`` trains
copy-only on random tokens and reports copy accuracy. ``fixed`` trains the smallest dependency:
one of four stage tokens at a fixed position, its successor 40 positions later as the last
token, random filler that is the same in every sequence; the loss covers the last ``--dilute``
tokens (1 = the dependent token alone, 64 = it and 63 constant ones), so it measures how a few
dependent tokens among many constant ones slow learning. All print one line per ``--every`` steps.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import random
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollyard.core.sample import Sample
from rollyard.engines.tiny_model import create_model
from rollyard.rollout.config import builtin_config
from rollyard.rollout.sft import demonstrations
from rollyard.sandbox import LocalProvider
from rollyard.tasks import load_task
from rollyard.tasks.families import generate
from rollyard.train.objective import LossConfig
from rollyard.train.sft import batches
from rollyard.train.trainer import TrainConfig, Trainer


def demos(
    model_dir: Path, n_tasks: int, task_seed: int, n: int, mistake: float, seed: int, family: str = "lookup"
) -> list[Sample]:
    cfg = builtin_config("demo", {"sft.demos": n, "sft.mistake_prob": mistake})
    root = Path(tempfile.mkdtemp(prefix="probe-"))
    tasks = [load_task(p) for p in generate(family, root / "tasks", n_tasks, seed=task_seed)]
    provider = LocalProvider(root / "sandboxes", unsafe=True)
    return asyncio.run(demonstrations(tasks, provider, model_dir, cfg, seed))


@torch.no_grad()
def score(model: torch.nn.Module, samples: list[Sample]) -> tuple[float, float, float]:
    """(greedy all-correct rate, mean p_clean at T=1, token accuracy) on the trained tokens."""
    model.eval()
    ok, probs, acc = 0, [], []
    for s in samples:
        ids = torch.tensor([s.token_ids])
        logits = model(ids).logits[0, :-1].float()
        target, mask = ids[0, 1:], torch.tensor(s.loss_mask[1:], dtype=torch.bool)
        logp = torch.log_softmax(logits, -1).gather(1, target[:, None])[:, 0]
        right = logits.argmax(-1) == target
        ok += int(right[mask].all())
        probs.append(math.exp(logp[mask].sum().item()))
        acc.append(right[mask].float().mean().item())
    model.train()
    return ok / len(samples), sum(probs) / len(probs), sum(acc) / len(acc)


def probe_sft(model: torch.nn.Module, model_dir: Path, a: argparse.Namespace) -> None:
    train = demos(model_dir, 256, 1, 512, a.mistake, a.seed, a.family)
    held = demos(model_dir, 64, 2, 64, 0.0, 99, a.family)
    trainer = Trainer(
        model, TrainConfig(lr=a.lr, token_budget=8192, loss=LossConfig(kind="sft"), betas=(0.9, a.beta2))
    )
    t0 = time.monotonic()
    for step, batch in zip(range(1, a.steps + 1), batches(train, a.batch, a.seed), strict=False):
        loss = trainer.train_step(batch)["loss"]
        if step % a.every == 0:
            greedy, p_clean, acc = score(model, held)
            print(f"sft step={step} loss={loss:.4f} tokacc={acc:.3f} greedy_ok={greedy:.3f} "
                  f"p_clean={p_clean:.3f} t={time.monotonic() - t0:.0f}s", flush=True)  # fmt: skip


def probe_repeat(model: torch.nn.Module, model_dir: Path, a: argparse.Namespace) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    head = tok.encode("<|im_start|>user\nRepeat:")
    mid = tok.encode("<|im_end|><|im_start|>assistant\n")
    n = 8
    rng = random.Random(a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, weight_decay=0.0)
    t0 = time.monotonic()
    for step in range(1, a.steps + 1):
        words = [[rng.randrange(300, 2000) for _ in range(n)] for _ in range(a.batch)]
        x = torch.tensor([head + w + mid + w for w in words])
        logp = torch.log_softmax(model(x).logits[:, -n - 1 : -1].float(), -1)
        loss = -logp.gather(2, x[:, -n:, None]).mean()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % a.every == 0:
            acc = (logp.argmax(-1) == x[:, -n:]).float().mean().item()
            dt = time.monotonic() - t0
            print(f"repeat step={step} loss={loss.item():.3f} copy_acc={acc:.2f} t={dt:.0f}s", flush=True)


def probe_fixed(model: torch.nn.Module, model_dir: Path, a: argparse.Namespace) -> None:
    tok = AutoTokenizer.from_pretrained(model_dir)
    stages = torch.tensor([tok.encode(w)[0] for w in ("alpha", "beta", "gamma", "delta")])
    src, ans = a.length - 41, a.length - 1  # the answer is last: the trained tail always holds it
    filler = torch.randint(300, 2000, (a.length,), generator=torch.Generator().manual_seed(a.seed))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, a.beta2), weight_decay=0.0)
    t0 = time.monotonic()
    for step in range(1, a.steps + 1):
        c = torch.randint(0, len(stages), (a.batch,))
        x = filler.repeat(a.batch, 1)
        x[:, src], x[:, ans] = stages[c], stages.roll(-1)[c]
        logits = model(x).logits
        trained = slice(a.length - a.dilute - 1, -1)
        loss = torch.nn.functional.cross_entropy(
            logits[:, trained].reshape(-1, logits.shape[-1]), x[:, a.length - a.dilute :].reshape(-1)
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a.every == 0:
            acc = (logits[:, ans - 1].argmax(-1) == x[:, ans]).float().mean().item()
            dt = time.monotonic() - t0
            print(f"fixed step={step} loss={loss.item():.4f} answer_acc={acc:.2f} t={dt:.0f}s", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("mode", choices=["sft", "repeat", "fixed"])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--family", default="lookup")
    p.add_argument("--mistake", type=float, default=0.3)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--length", type=int, default=120, help="fixed: sequence length")
    p.add_argument("--dilute", type=int, default=64, help="fixed: trained tokens at the end")
    p.add_argument("--model-dir", type=Path, default=Path(".cache/probe-model"))
    a = p.parse_args()
    torch.set_num_threads(2)
    if not (a.model_dir / "config.json").exists():
        create_model(a.model_dir, seed=a.seed, size="tiny", overwrite=True)
    torch.manual_seed(a.seed)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    {"sft": probe_sft, "repeat": probe_repeat, "fixed": probe_fixed}[a.mode](model, a.model_dir, a)


if __name__ == "__main__":
    main()
