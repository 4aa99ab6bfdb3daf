# rollyard: every entry point a developer needs. `make setup` is idempotent.
PY ?= .venv/bin/python
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export VLLM_NO_USAGE_STATS := 1
export LITELLM_LOCAL_MODEL_COST_MAP := True

.PHONY: setup test test-fast test-agents test-cluster test-bench demo bench lint fmt clean

setup:
	bash scripts/setup.sh

test: setup
	$(PY) -m pytest -q -ra -m "not cluster and not longbench"

test-fast: setup
	$(PY) -m pytest -q -ra -m "not slow and not engine"

# Real agent CLIs (mini-SWE-agent, Codex, Claude Code): installed into .cache once, run in
# sandboxes against the gateway, and trained through `rollyard train` for one step each.
# Claude Code's training test runs only here (a ~32k-token prompt: too slow for CI).
test-agents: setup
	ROLLYARD_TEST_AGENTS=1 $(PY) -m pytest -q -ra tests/agents \
		tests/rollout/test_train_e2e.py -k "agents or mini_swe or codex or claude"

# Two Ray nodes on this host, each in its own network namespace (unshare -Urn, a veth pair):
# the head runs `rollyard train`, the worker node the engine, agents and sandboxes; then the
# worker node is lost mid-run and the run resumes (tests/rollout/test_two_nodes.py).
test-cluster: setup
	$(PY) -m pytest -q -ra -s -m cluster tests/rollout/test_two_nodes.py

# Benchmarks whose smallest version takes 20+ minutes on 2 cores (rollyard bench offpolicy:
# 7 SmolLM2 runs), run end to end and checked (tests/bench/test_offpolicy_bench.py).
test-bench: setup
	$(PY) -m pytest -q -ra -m longbench tests/bench

demo: setup
	.venv/bin/rollyard demo

bench: setup
	.venv/bin/rollyard bench all

lint: setup
	.venv/bin/ruff check src tests
	.venv/bin/ruff format --check src tests
	.venv/bin/vulture src vulture_whitelist.py --min-confidence 60

fmt:
	.venv/bin/ruff format src tests
	.venv/bin/ruff check --fix src tests

clean:
	rm -rf .venv .pytest_cache .ruff_cache .hypothesis runs
