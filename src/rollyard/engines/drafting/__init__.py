"""Grouped speculative drafting inside vLLM: a suffix index per RL group, adaptive draft length.

Imported by the engine process (``custom_class`` proposer), so it imports only numpy and the
standard library.
"""

from rollyard.engines.drafting.config import DraftingConfig
from rollyard.engines.drafting.groups import GroupIndexes, GroupTable
from rollyard.engines.drafting.proposer import DrafterSettings, GroupedSuffixDrafter, SoloSuffixDrafter
from rollyard.engines.drafting.rows import Request, RowTracker
from rollyard.engines.drafting.suffix import SuffixIndex

__all__ = [
    "DrafterSettings",
    "DraftingConfig",
    "GroupIndexes",
    "GroupTable",
    "GroupedSuffixDrafter",
    "Request",
    "RowTracker",
    "SoloSuffixDrafter",
    "SuffixIndex",
]
