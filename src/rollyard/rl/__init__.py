"""The mathematics between trajectories and gradients: rewards, advantages, losses, buffer.

Pure code over ``rollyard.core`` types (and torch for the losses); no engine, no sandbox.
"""

from rollyard.rl.advantages import (
    AdvantageConfig,
    AdvantageMode,
    build_samples,
    chunk_advantages,
    group_samples,
    grpo_advantages,
    turn_advantages,
    turn_chunks,
)
from rollyard.rl.buffer import (
    AsyncBuffer,
    BufferConfig,
    Release,
    Released,
    ReleaseRule,
    StaleAction,
    WindowedFifo,
)
from rollyard.rl.judge import TranscriptJudge, parse_score
from rollyard.rl.language import is_language_mixed, script_counts
from rollyard.rl.loss_inputs import Aggregation
from rollyard.rl.losses import cispo_loss, gspo_loss, ipa_chunk_loss, ppo_clip_loss
from rollyard.rl.masks import mask_sequences, sequence_keep
from rollyard.rl.reward_base import (
    RewardContext,
    TermKind,
    get_reward,
    register_reward,
    registered_rewards,
    transcript,
    turn_text,
)
from rollyard.rl.rewards import (
    JudgeSettings,
    RewardBreakdown,
    RewardConfig,
    TermSpec,
    reward_to_go,
    score_group,
    with_rewards,
)

__all__ = [
    "AdvantageConfig",
    "AdvantageMode",
    "Aggregation",
    "AsyncBuffer",
    "BufferConfig",
    "JudgeSettings",
    "Release",
    "ReleaseRule",
    "Released",
    "RewardBreakdown",
    "RewardConfig",
    "RewardContext",
    "StaleAction",
    "TermKind",
    "TermSpec",
    "TranscriptJudge",
    "WindowedFifo",
    "build_samples",
    "chunk_advantages",
    "cispo_loss",
    "get_reward",
    "group_samples",
    "grpo_advantages",
    "gspo_loss",
    "ipa_chunk_loss",
    "is_language_mixed",
    "mask_sequences",
    "parse_score",
    "ppo_clip_loss",
    "register_reward",
    "registered_rewards",
    "reward_to_go",
    "score_group",
    "script_counts",
    "sequence_keep",
    "transcript",
    "turn_advantages",
    "turn_chunks",
    "turn_text",
    "with_rewards",
]
