"""Config loading: defaults are valid, bad input names the field that is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.core.errors import ConfigError
from rollyard.rollout.config import Config, builtin_config, dump_config, load_config
from rollyard.rollout.entry import parse_overrides


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_embedded_configs_validate_and_round_trip(tmp_path: Path) -> None:
    for name in ("demo", "quick", "demo-smollm2", "demo-mini-swe-agent", "full"):
        cfg = builtin_config(name)
        again = load_config(write(tmp_path, dump_config(cfg)))
        assert again.run == cfg.run
        assert again.trainer == cfg.trainer
        assert again.sft == cfg.sft
    cli = builtin_config("demo-mini-swe-agent")
    assert (cli.agent.kind, cli.agent.profile, cli.sft.kind) == ("blackbox", "mini-swe-agent", "scripted")


def test_an_unknown_key_is_rejected_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"trainer\.lrr: unknown key"):
        load_config(write(tmp_path, "model: {path: m}\ntrainer: {lrr: 0.1}\n"))


def test_a_bad_value_is_reported_with_its_path(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"run\.group_size: Input should be greater than or equal to 2"):
        load_config(write(tmp_path, "model: {path: m}\nrun: {group_size: 1}\n"))


def test_the_model_section_is_required(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"model: missing"):
        load_config(write(tmp_path, "run: {steps: 3}\n"))


def test_a_pretrained_model_is_named_from_the_known_ones(tmp_path: Path) -> None:
    assert builtin_config("demo-smollm2").model.pretrained == "smollm2-135m"
    with pytest.raises(ConfigError, match=r"model: .*unknown pretrained model 'gpt-9'.*smollm2-135m"):
        load_config(write(tmp_path, "model: {path: m, create: true, pretrained: gpt-9}\n"))


def test_a_task_set_needs_exactly_one_source(tmp_path: Path) -> None:
    text = "model: {path: m}\ntasks: {train: {family: lookup, path: somewhere}}\n"
    with pytest.raises(ConfigError, match=r"tasks\.train.*exactly one of family or path"):
        load_config(write(tmp_path, text))


def test_a_buffer_that_splits_groups_is_refused(tmp_path: Path) -> None:
    text = "model: {path: m}\nbuffer: {rule: fifo, group_whole: false}\n"
    with pytest.raises(ConfigError, match="group_whole must be true"):
        load_config(write(tmp_path, text))


def test_not_yaml_and_missing_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "model: [unclosed\n"))
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_relative_paths_resolve_against_the_config_file(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "model: {path: models/tiny}\n"))
    assert cfg.model.path == (tmp_path / "models" / "tiny").resolve()


def test_overrides_set_dotted_keys_as_yaml_scalars(tmp_path: Path) -> None:
    ov = parse_overrides(["run.steps=7", "trainer.lr=3e-4", "ray.address=local"])
    cfg = load_config(write(tmp_path, "model: {path: m}\n"), ov)
    assert (cfg.run.steps, cfg.trainer.lr, cfg.ray.address) == (7, 3e-4, "local")
    with pytest.raises(ConfigError, match=r"key\.path=value"):
        parse_overrides(["steps"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"agent.kind": "blackbox"}, "agent.profile is required"),
        (
            {"agent.kind": "blackbox", "agent.profile": "nope", "sft.enabled": False},
            "no runner profile 'nope'",
        ),
    ],
)
def test_a_blackbox_agent_needs_a_known_profile(overrides: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        builtin_config("demo", overrides)
    ok = builtin_config("demo", {"agent.kind": "blackbox", "agent.profile": "openai", "sft.enabled": False})
    assert ok.agent.profile == "openai"
    # on Ray workers too: their node relays the sandbox's socket to the gateway (tests/rollout/test_ray.py)
    ray = {"agent.kind": "blackbox", "agent.profile": "openai", "sft.enabled": False, "ray.address": "local"}
    assert builtin_config("demo", ray).ray.address == "local"


def test_a_blackbox_agent_may_warm_start_on_its_own_prompts() -> None:
    cfg = builtin_config("demo", {"agent.kind": "blackbox", "agent.profile": "codex", "sft.enabled": True})
    assert cfg.sft.enabled and cfg.agent.profile == "codex"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"agent.kind": "whitebox", "agent.profile": None}, "sft.kind: scripted runs a blackbox CLI"),
        ({"tasks.train.family": "stage"}, "scripts readout and lookup tasks, not 'stage'"),
        ({"agent.profile": "codex"}, "agent.profile 'codex' does not finish with one"),
    ],
)
def test_the_scripted_warm_start_is_refused_where_its_script_cannot_apply(
    overrides: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        builtin_config("demo-mini-swe-agent", overrides)
    builtin_config("demo-mini-swe-agent", {**overrides, "sft.kind": "finish"})  # the other warm start is fine


def test_sync_mode_seer_policy_and_divided_rollout_are_config_keys(tmp_path: Path) -> None:
    text = "model: {path: m}\nrun: {mode: sync}\ngateway: {policy: seer, divided: {chunk_tokens: 64}}\n"
    cfg = load_config(write(tmp_path, text))
    assert cfg.run.mode == "sync" and cfg.gateway.divided and cfg.gateway.divided.chunk_tokens == 64
    assert cfg.gateway.scheduling.build().name == "seer"
    assert builtin_config("quick").gateway.divided is None and builtin_config("quick").run.mode == "async"
    with pytest.raises(ConfigError, match=r"run\.mode"):
        load_config(write(tmp_path, "model: {path: m}\nrun: {mode: lockstep}\n"))
    with pytest.raises(ConfigError, match=r"gateway\.divided\.chunk_tokens"):
        load_config(write(tmp_path, "model: {path: m}\ngateway: {divided: {chunk_tokens: 0}}\n"))
    with pytest.raises(ConfigError, match="starve_s"):
        load_config(
            write(
                tmp_path, "model: {path: m}\ngateway: {policy: seer, scheduling: {options: {starve_s: -1}}}\n"
            )
        )


def test_gateway_limits_are_configurable_and_checked() -> None:
    from rollyard.rollout.config import GatewayConfig

    cfg = GatewayConfig.model_validate(
        {"limits": {"max_body_bytes": 2048, "open_metrics": True, "error_budget": 0}}
    )
    assert cfg.limits.max_body_bytes == 2048 and cfg.limits.open_metrics and cfg.limits.error_budget == 0
    with pytest.raises(ValueError):
        GatewayConfig.model_validate({"limits": {"max_body_bytes": 10}})
    with pytest.raises(ValueError):
        GatewayConfig.model_validate({"limits": {"no_such_knob": 1}})


def test_the_demo_knows_its_models(tmp_path: Path) -> None:
    from rollyard.rollout.entry import DEMO_MODELS, run_demo

    assert DEMO_MODELS == {"tiny": "demo", "smollm2": "demo-smollm2"}
    with pytest.raises(ConfigError, match="unknown demo model 'gpt-9'; choose one of: tiny, smollm2"):
        run_demo(0, tmp_path / "run", False, {}, model="gpt-9")
    with pytest.raises(ConfigError, match="--quick"):
        run_demo(0, tmp_path / "run", True, {}, model="smollm2")
    with pytest.raises(ConfigError, match="no CLI-learning demo for 'aider'; choose one of: mini-swe-agent"):
        run_demo(0, tmp_path / "run", False, {}, agent="aider")
    with pytest.raises(ConfigError, match="--quick"):
        run_demo(0, tmp_path / "run", True, {}, agent="mini-swe-agent")
    assert not (tmp_path / "run").exists()


def test_the_cli_demo_fails_before_installing_into_a_cache_sandboxes_cannot_reach(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """root's default cache is under a private /root: the demo names the fix before installing."""
    from rollyard.rollout.entry import run_demo

    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    monkeypatch.setenv("ROLLYARD_CACHE", str(home / ".cache" / "rollyard"))
    with pytest.raises(ConfigError, match=r"run `export ROLLYARD_CACHE=/var/cache/rollyard`"):
        run_demo(0, tmp_path / "run", False, {}, agent="mini-swe-agent")
    assert not (home / ".cache").exists() and not (tmp_path / "run").exists()


def test_engines_go_on_ray_with_an_address_and_their_placement_is_checked() -> None:
    assert not builtin_config("quick").engines_on_ray
    assert builtin_config("quick", {"ray.address": "local"}).engines_on_ray
    assert not builtin_config("quick", {"ray.address": "local", "engine.placement": "local"}).engines_on_ray
    assert not builtin_config("quick", {"ray.address": "local", "engine.urls": ["http://e:1"]}).engines_on_ray
    with pytest.raises(ConfigError, match=r"engine\.placement: ray needs ray\.address"):
        builtin_config("quick", {"engine.placement": "ray"})
    with pytest.raises(ConfigError, match="gpus_per_engine places engines on Ray"):
        builtin_config("quick", {"engine.gpus_per_engine": 1})
    with pytest.raises(ConfigError, match=r"tensor_parallel_size=2 needs engine.gpus_per_engine >= 2"):
        builtin_config("quick", {"ray.address": "h:6379", "engine.tensor_parallel_size": 2})
    # memory publishing to engines on other nodes: the trainer's loopback address would not do
    with pytest.raises(ConfigError, match=r"publish\.host 127\.0\.0\.1 is loopback"):
        builtin_config("quick", {"ray.address": "h:6379"})
    ok = {"ray.address": "h:6379", "publish.host": "10.0.0.1", "engine.gpus_per_engine": 2}
    assert builtin_config("quick", {**ok, "engine.tensor_parallel_size": 2}).engines_on_ray
    assert builtin_config("quick", {"ray.address": "h:6379", "publish.mode": "disk"}).engines_on_ray


def test_required_turns_and_the_opening_belong_to_a_forcing_whitebox_agent() -> None:
    with pytest.raises(ConfigError, match=r"required_turns needs agent\.tool_choice: required"):
        builtin_config("demo", {"agent.required_turns": 2})
    blackbox = {"agent.kind": "blackbox", "agent.profile": "openai", "sft.enabled": False}
    with pytest.raises(ConfigError, match="configure the whitebox agent only"):
        builtin_config("demo", {**blackbox, "agent.opening": ["ls"]})
    with pytest.raises(ConfigError, match=r"run\.top_p"):
        builtin_config("demo", {"run.top_p": 0})
    full = builtin_config("full")
    assert (full.agent.required_turns, full.agent.opening, full.run.top_p) == (2, ["ls data /tests"], 0.9)


def test_trainer_placement_chooses_where_ranks_run() -> None:
    """``auto``: Ray actors when the run has a Ray address and more than one rank; ``ray`` without
    an address is refused; ``local`` keeps spawned ranks even on Ray."""
    assert not builtin_config("quick", {"trainer.world_size": 2}).ranks_on_ray
    assert builtin_config("quick", {"trainer.world_size": 2, "ray.address": "local"}).ranks_on_ray
    assert not builtin_config("quick", {"ray.address": "local"}).ranks_on_ray  # one rank: none to place
    local = {"trainer.world_size": 2, "ray.address": "local", "trainer.placement": "local"}
    assert not builtin_config("quick", local).ranks_on_ray
    with pytest.raises(ConfigError, match=r"trainer\.placement: ray needs ray\.address"):
        builtin_config("quick", {"trainer.world_size": 2, "trainer.placement": "ray"})
    with pytest.raises(ConfigError, match="ray_strategy"):
        builtin_config("quick", {"trainer.ray_strategy": "RANDOM"})


def test_trainer_collective_timeout_is_checked_and_kept_out_of_the_train_config() -> None:
    cfg = builtin_config("quick", {"trainer.collective_timeout_s": 5})
    assert cfg.trainer.collective_timeout_s == 5
    assert "collective_timeout_s" not in cfg.trainer.train_config().model_dump()
    for bad in (0, -1, 10**6):
        with pytest.raises(ConfigError, match="collective_timeout_s"):
            builtin_config("quick", {"trainer.collective_timeout_s": bad})


def test_rollyard_train_refuses_to_run_as_one_of_torchruns_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollyard.rollout.entry import run_training

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(
        ConfigError, match=r"rank 1 of WORLD_SIZE=2 .*trainer\.world_size.*env -u RANK -u WORLD_SIZE"
    ):
        run_training(Path("quick"), None, None, None, {})


def test_a_resumed_run_may_move_its_ranks_but_not_onto_ray_without_an_address(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollyard.rollout import entry
    from rollyard.rollout.rundir import RunDir

    RunDir(tmp_path).create(builtin_config("quick", {"ray.address": "local"}))
    seen: list[Config] = []
    monkeypatch.setattr(entry, "_execute", lambda cfg, run, resume: seen.append(cfg) or {})
    moved = {
        "trainer.world_size": 2,
        "trainer.cpus_per_rank": 2,
        "trainer.ray_strategy": "SPREAD",
        "trainer.collective_timeout_s": 120,
    }
    entry.run_training(None, None, tmp_path, None, moved)
    t = seen[0].trainer
    assert (t.world_size, t.cpus_per_rank, t.ray_strategy, t.collective_timeout_s) == (2, 2, "SPREAD", 120)
    assert seen[0].ranks_on_ray

    RunDir(tmp_path / "cpu").create(builtin_config("quick"))  # started without Ray
    with pytest.raises(ConfigError, match=r"resumed run keeps the ray\.address it was started with"):
        entry.run_training(None, None, tmp_path / "cpu", None, {"trainer.placement": "ray"})
