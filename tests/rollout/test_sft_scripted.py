"""The scripted engine of the CLI warm start (``sft.kind: scripted``): served in vLLM's shape, it
answers a rendered readout prompt with the solver's next tool call, reading the value only from
the tool output in the prompt."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rollyard.core.errors import ConfigError
from rollyard.core.sampling import SamplingParams
from rollyard.core.trajectory import FinishReason, Segment, Trajectory, Turn
from rollyard.engines import chat_template as ct
from rollyard.engines.vllm import VLLMBackend
from rollyard.gateway.tokenizer import FastTokenizer
from rollyard.rollout.sft_scripted import ReadoutScript, commands, program_samples, scripted_engine

TASK = "Please solve this issue: Find the value of amber in data/ and write it to answer.txt."
# a system prompt whose tool example is not a call the assistant made
SYSTEM = 'Call tools as <tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>.'
FINISH_CMD = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def _msg(role: str, body: str) -> str:
    return f"{ct.IM_START}{role}\n{body}{ct.IM_END}"


def _first(tok: FastTokenizer) -> list[int]:
    return tok.encode(_msg("system", SYSTEM) + _msg("user", TASK) + f"{ct.IM_START}assistant\n")


def _after(tok: FastTokenizer, prompt: list[int], reply: list[int], output: str) -> list[int]:
    observation = json.dumps({"returncode": 0, "output": output})
    return [*prompt, *reply, *tok.encode(_msg("tool", observation) + f"{ct.IM_START}assistant\n")]


def _script(tok: FastTokenizer, mistake_prob: float) -> ReadoutScript:
    finish = [*tok.encode(ct.format_tool_call("bash", {"command": FINISH_CMD})), tok.eos_id]
    return ReadoutScript(tok, finish, mistake_prob, seed=3)


def _command(tok: FastTokenizer, ids: list[int]) -> str:
    (cmd,) = commands(f"{ct.IM_START}assistant\n" + tok.decode(ids))
    return cmd


@pytest.mark.parametrize("mistake_prob", [0.0, 1.0])
async def test_the_scripted_engine_reads_then_writes_what_grep_printed_or_guesses(
    tiny_model_dir: Path, mistake_prob: float
) -> None:
    tok = FastTokenizer(tiny_model_dir)
    script = _script(tok, mistake_prob)
    params = SamplingParams(max_tokens=64)
    with scripted_engine(script, max_model_len=2048) as url:
        engine = VLLMBackend(url)
        try:
            first = _first(tok)
            one = await engine.generate(first, params)
            assert one.finish_reason == FinishReason.STOP and one.token_ids[-1] == tok.eos_id
            cmd = _command(tok, one.token_ids)
            if mistake_prob == 0.0:
                assert cmd == "grep -r amber data" and (script.reads, script.guesses) == (1, 0)
                # the value it writes is the one in grep's output, not any other
                second = _after(tok, first, one.token_ids, "data/f1.txt:amber=42\ndata/f1.txt:birch=17\n")
                two = await engine.generate(second, params)
                assert _command(tok, two.token_ids) == "echo 42 > answer.txt"
            else:
                assert re.fullmatch(r"echo \d\d > answer\.txt", cmd) and (script.reads, script.guesses) == (
                    0,
                    1,
                )
                second, two = first, one
            third = _after(tok, second, two.token_ids, "")
            done = await engine.generate(third, params)
            assert done.token_ids == script.finish and done.finish_reason == FinishReason.STOP
            # a cap below the reply cuts it as an engine would: no end of turn
            cut = await engine.generate(third, SamplingParams(max_tokens=5))
            assert cut.token_ids == script.finish[:5] and cut.finish_reason == FinishReason.LENGTH
        finally:
            await engine.aclose()


def test_a_prompt_without_a_lookup_task_is_refused(tiny_model_dir: Path) -> None:
    tok = FastTokenizer(tiny_model_dir)
    with pytest.raises(ConfigError, match="Find the value of KEY"):
        _script(tok, 0.0).command(_msg("user", "Fix the bug.") + f"{ct.IM_START}assistant\n")


def test_a_recorded_program_is_one_sample_with_exactly_the_ended_replies_as_loss() -> None:
    """Token-exact: the sample is the last turn's prompt and reply as the gateway recorded them;
    loss on replies that ended with the end-of-turn id, none on a reply cut by the length cap."""
    eos = 2
    p1, r1 = [10, 11, 12], [20, 21, eos]
    obs = [30, 31]
    p2, r2 = [*p1, *r1, *obs], [40, eos]
    p3, r3 = [*p2, *r2, 50], [60, 61]  # cut: no end of turn
    turns = [
        Turn(prompt_ids=p1, completion_ids=r1, completion_logprobs=[0.0] * 3),
        Turn(prompt_ids=p2, completion_ids=r2, completion_logprobs=[0.0] * 2),
        Turn(
            prompt_ids=p3, completion_ids=r3, completion_logprobs=[0.0] * 2, finish_reason=FinishReason.LENGTH
        ),
    ]
    traj = Trajectory(program_id="p", group_id="g", segments=[Segment(turns=turns)])
    (s,) = program_samples([traj], eos)
    assert s.token_ids == [*p3, *r3] and s.group_id == "g"
    assert s.loss_mask == [0] * 3 + [1] * 3 + [0] * 2 + [1] * 2 + [0] + [0] * 2
    # a rewritten context (a new segment) trains as a sample of its own
    other = Turn(prompt_ids=[99, 98], completion_ids=[97, eos], completion_logprobs=[0.0] * 2)
    traj2 = Trajectory(program_id="q", segments=[Segment(turns=[turns[0]]), Segment(turns=[other])])
    a, b = program_samples([traj2], eos)
    assert (a.token_ids, b.token_ids, b.loss_mask) == ([*p1, *r1], [99, 98, 97, eos], [0, 0, 1, 1])
