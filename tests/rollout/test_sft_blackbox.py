"""The black-box warm start's pure parts: the reply a CLI is taught to end its turn with."""

from __future__ import annotations

from pathlib import Path

from rollyard.agents.blackbox import load_profile
from rollyard.agents.blackbox.profile import FinishReply
from rollyard.engines import chat_template as ct
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.rollout.sft_blackbox import eot_samples, finish_ids


def test_a_plain_reply_is_its_text_then_the_end_of_turn(tiny_model_dir: Path) -> None:
    tok = FastTokenizer(tiny_model_dir)
    ids = finish_ids(tok, load_profile("codex").finish)
    assert ids[-1] == tok.eos_id and tok.decode(ids[:-1]) == "Done."
    parsed = ct.parse_assistant(tok.decode(ids[:-1]))
    assert parsed.tool_calls == [] and not parsed.malformed  # Codex and Claude Code see a finished turn


def test_mini_swe_agents_reply_is_its_submit_command_as_one_bash_call(tiny_model_dir: Path) -> None:
    tok = FastTokenizer(tiny_model_dir)
    ids = finish_ids(tok, load_profile("mini-swe-agent").finish)
    assert ids[-1] == tok.eos_id
    parsed = ct.parse_assistant(tok.decode(ids[:-1]))
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [
        ("bash", {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"})
    ]


def test_text_before_a_call_is_kept_on_its_own_line(tiny_model_dir: Path) -> None:
    tok = FastTokenizer(tiny_model_dir)
    ids = finish_ids(tok, FinishReply(text="Finished.", tool="bash", arguments={"command": "true"}))
    parsed = ct.parse_assistant(tok.decode(ids[:-1]))
    assert parsed.content.strip() == "Finished." and parsed.tool_calls[0].name == "bash"


def test_each_prompt_is_context_and_only_the_reply_is_trained() -> None:
    samples = eot_samples([[1, 2, 3], [], [1, 2, 4, 5]], [7, 2])
    assert [s.token_ids for s in samples] == [[1, 2, 3, 7, 2], [1, 2, 4, 5, 7, 2]]  # empty prompt skipped
    assert [s.loss_mask for s in samples] == [[0, 0, 0, 1, 1], [0, 0, 0, 0, 1, 1]]
