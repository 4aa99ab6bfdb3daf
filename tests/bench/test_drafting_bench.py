"""``rollyard bench drafting``'s model: the reading demo's warm start, cached by what decides it."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from rollyard.bench import _readout
from rollyard.bench._readout import sft_config, sft_dir, sft_key, sft_model
from rollyard.rollout.config import resolve_paths


def test_the_cache_key_follows_what_decides_the_weights_and_nothing_else(tmp_path: Path) -> None:
    base = sft_key(sft_config())
    assert base == sft_key(sft_config())  # stable across processes: a hash of sorted JSON
    assert sft_key(resolve_paths(sft_config(), tmp_path)) == base  # where the model goes: no
    for field, value in (
        ("sft.lr", 1e-4),
        ("sft.demos", 8),
        ("tasks.train.seed", 7),
        ("run.seed", 3),
        ("agent.max_tool_output_chars", 100),
        ("model.pretrained", None),
    ):
        section, _, name = field.rpartition(".")
        cfg = sft_config()
        target = cfg
        for part in section.split("."):
            target = getattr(target, part)
        setattr(target, name, value)
        assert sft_key(cfg) != base, field
    unrelated = sft_config()
    unrelated.engine.count = 4
    unrelated.run.steps = 99
    unrelated.trainer.lr = 1.0
    assert sft_key(unrelated) == base  # RL's knobs do not change the warm start


def test_a_cached_warm_start_is_reused_without_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_training(*_: object) -> Path:
        raise AssertionError("warm-started again despite the cache")

    monkeypatch.setattr(_readout, "_warm_start", no_training)
    cached = sft_dir(sft_config(), tmp_path) / "model"
    cached.mkdir(parents=True)
    (cached / "config.json").write_text("{}")
    assert sft_model(root=tmp_path) == cached
    other = sft_config()
    other.sft.lr = 1e-4
    with pytest.raises(AssertionError, match="warm-started again"):
        sft_model(other, root=tmp_path)  # another recipe: another key, nothing cached


async def test_agent_turns_are_the_demonstrations_contexts(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Each turn's context extends the previous turn's by its tool call and the real tool reply;
    the SFT demonstration built from the same turns trains exactly the tool calls."""
    from rollyard.gateway.renderer import Renderer
    from rollyard.gateway.tokenizer import FastTokenizer
    from rollyard.rollout.sft import demonstration, solved_turns
    from rollyard.sandbox.local import LocalProvider
    from rollyard.tasks import generate, load_task

    cfg = sft_config()
    task = load_task(generate("readout", tmp_path / "tasks", 1, seed=3)[0])
    provider = LocalProvider(tmp_path / "sandboxes", unsafe=True)
    renderer = Renderer(FastTokenizer(tiny_model_dir))
    turns = await solved_turns(task, provider, renderer, cfg, mistake_prob=0.0, seed=0)
    assert len(turns) == 3  # grep, write the value, submit
    gen = renderer.gen_prompt_ids
    for (context, completion), (later, _) in itertools.pairwise(turns):
        assert later[: len(context) + len(completion)] == [*context, *completion]
        assert later[-len(gen) :] == gen and len(later) > len(context) + len(completion) + len(gen)
    reply = turns[1][0][len(turns[0][0]) + len(turns[0][1]) : -len(gen)]
    assert task.spec.metadata["value"] in renderer.tok.decode(reply)  # what the grep printed
    sample = await demonstration(task, provider, renderer, cfg, mistake_prob=0.0, seed=0)
    last_context, last_call = turns[-1]
    assert sample.token_ids == [*last_context, *last_call]
    trained = [t for t, m in zip(sample.token_ids, sample.loss_mask, strict=True) if m]
    assert trained == [t for _, call in turns for t in call]
