"""rollyard: the rollout yard for agentic reinforcement learning."""

__version__ = "0.1.0"
