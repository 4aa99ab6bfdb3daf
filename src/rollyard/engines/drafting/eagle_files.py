"""Where an eagle draft head lives on disk: its own dir (``config.json`` + ``model.safetensors``,
what vLLM's ``eagle`` method loads), and under a published policy version, ``draft_head/``
beside the policy's weights (the engine's worker extension loads it with the policy); in a
memory publish, its tensors travel with the policy's under ``HEAD_PREFIX``.

Standard library only: the engine process imports it."""

HEAD_DIR = "draft_head"
HEAD_FILE = "model.safetensors"
HEAD_META = "rollyard_head.json"  # the head's training counters and the policy it was fit to
HEAD_PREFIX = "rollyard_draft_head."  # a head's tensors among the policy's in a memory publish
