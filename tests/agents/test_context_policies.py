from __future__ import annotations

from rollyard.agents import ContextPolicy, PolicyKind, apply_policy
from rollyard.agents.context import Message


def _history(turns: int) -> list[Message]:
    msgs: list[Message] = [{"role": "system", "content": "sys"}, {"role": "user", "content": "task"}]
    for i in range(turns):
        msgs.append(
            {"role": "assistant", "content": f"<think>plan {i}</think>act {i}", "reasoning_content": "r"}
        )
        msgs.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"out {i}"})
    return msgs


def test_discard_all_keeps_system_and_task_once_tokens_pass_the_fraction() -> None:
    p = ContextPolicy(kind=PolicyKind.DISCARD_ALL, fraction=0.3)
    msgs = _history(4)
    assert apply_policy(p, msgs, tokens=300, context_limit=1000) is msgs
    assert apply_policy(p, msgs, tokens=301, context_limit=1000) == msgs[:2]
    assert apply_policy(p, msgs, tokens=10**6, context_limit=None) is msgs  # no limit, no trigger


def test_keep_first_last_keeps_k_turns_at_each_end_with_their_tool_results() -> None:
    p = ContextPolicy(kind=PolicyKind.KEEP_FIRST_LAST, fraction=None, k=2)
    msgs = _history(6)
    out = apply_policy(p, msgs, tokens=0, context_limit=None)
    kept = [m["content"] for m in out if m["role"] == "tool"]
    assert kept == ["out 0", "out 1", "out 4", "out 5"]
    assert out[:2] == msgs[:2]
    assert apply_policy(p, _history(4), tokens=0, context_limit=None) == _history(4)


def test_drop_thinking_strips_reasoning_but_keeps_the_action_text() -> None:
    p = ContextPolicy(kind=PolicyKind.DROP_THINKING, fraction=None)
    out = apply_policy(p, _history(2), tokens=0, context_limit=None)
    assistants = [m for m in out if m["role"] == "assistant"]
    assert [m["content"] for m in assistants] == ["act 0", "act 1"]
    assert not any("reasoning_content" in m for m in assistants)
    once = apply_policy(p, out, tokens=0, context_limit=None)
    assert once is out  # nothing left to drop: no rewrite
