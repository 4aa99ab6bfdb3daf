"""Prefix-tree packing: merge samples that share token prefixes into trees, pack trees by a token budget.

Pure code (numpy only). Samples are inserted into one token trie, so group members that share a
prompt, and the call-by-call samples of one trajectory (each a prefix of the next), share nodes.
The forest is flattened in DFS preorder, where the ancestors of node ``i`` are exactly the nodes
``j <= i < subtree_end[j]``; that is the whole tree attention mask, and position ids are depths.

Loss terms stay per original (sample, position): ``token_index`` maps every token of every sample
to its packed node, so two samples that share a node share its logits but keep their own masks,
advantages and behaviour logprobs. Token ``t`` is predicted from the node of token ``t-1``.

Cut rule (``max_tree_tokens``, ``token_budget``): samples, taken in reverse DFS order of their
last token, are cut greedily into parts; a part is forwarded as the union of its samples' root paths
(ancestor-closed, so each sample is computed whole in its part, and exact: shared nodes are
recomputed per part, never approximated). Hence, for any forest and any cap:

- forwarded tokens <= unmerged tokens (a union of paths is never longer than their sum), with
  equality for ``merge=False``; no node is forwarded that no sample of its part needs;
- a part holds at most ``min(max_tree_tokens, token_budget)`` tokens and a micro-batch at most
  ``token_budget``, except a single sample longer than that: it gets a part and micro-batch of its
  own, exactly as long as the sample (what the unmerged baseline forwards too; a sample is never
  split, since each of its tokens needs the whole prefix).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from rollyard.core.errors import DataError
from rollyard.core.sample import Sample


@dataclass(frozen=True)
class MicroBatch:
    """One packed row: a forest of (parts of) trees forwarded in one pass."""

    input_ids: np.ndarray  # (L,) int64
    position_ids: np.ndarray  # (L,) int64, depth in the tree
    parent: np.ndarray  # (L,) int64, -1 for roots
    subtree_end: np.ndarray  # (L,) int64, exclusive end of each node's DFS range
    samples: list[int]  # indices into the batch, computed in this micro-batch
    token_index: list[np.ndarray]  # per sample: packed index of each of its tokens

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def is_chain(self) -> bool:
        """One unbranched sequence: the tree mask is the plain causal mask."""
        n = self.num_tokens
        return bool(np.array_equal(self.parent, np.arange(-1, n - 1)))

    def ancestor_mask(self) -> np.ndarray:
        """(L, L) bool: row i may attend to column j (j is i or an ancestor of i)."""
        idx = np.arange(self.num_tokens)
        return (idx[None, :] <= idx[:, None]) & (idx[:, None] < self.subtree_end[None, :])


@dataclass(frozen=True)
class PackedBatch:
    micro_batches: list[MicroBatch]
    num_samples: int
    unmerged_tokens: int  # sum of sample lengths
    merged_tokens: int  # trie nodes (each shared prefix counted once)
    forwarded_tokens: int  # tokens actually forwarded, including recomputed ancestor paths
    stats: dict[str, float] = field(default_factory=dict)

    @property
    def merge_ratio(self) -> float:
        """Unmerged over forwarded tokens: how much less the trainer forwards."""
        return self.unmerged_tokens / max(self.forwarded_tokens, 1)


@dataclass
class _Forest:
    """The trie flattened in DFS preorder."""

    tokens: np.ndarray
    depth: np.ndarray
    parent: np.ndarray
    end: np.ndarray
    sample_nodes: list[np.ndarray]  # per sample: preorder index of each token


def _build_forest(token_lists: Sequence[Sequence[int]], merge: bool) -> _Forest:
    children: list[dict[int, int]] = [{}]  # node 0 is a virtual root
    node_token: list[int] = [-1]
    raw_paths: list[list[int]] = []
    for toks in token_lists:
        node = 0
        path: list[int] = []
        if not merge:  # a fresh root per sample: no sharing at all
            children.append({})
            node_token.append(-2)
            children[0][-(len(children))] = len(children) - 1
            node = len(children) - 1
        for t in toks:
            nxt = children[node].get(t)
            if nxt is None:
                nxt = len(children)
                children.append({})
                node_token.append(int(t))
                children[node][int(t)] = nxt
            path.append(nxt)
            node = nxt
        raw_paths.append(path)

    n_nodes = len(children)
    order = np.full(n_nodes, -1, dtype=np.int64)
    tokens: list[int] = []
    depth: list[int] = []
    parent: list[int] = []
    end = np.zeros(n_nodes, dtype=np.int64)
    # Iterative DFS; a virtual (root or per-sample) node gets no preorder slot.
    stack: list[tuple[int, int, int, bool]] = [(0, -1, -1, False)]  # node, parent slot, depth, exiting
    while stack:
        node, pslot, d, exiting = stack.pop()
        if exiting:
            end[node] = len(tokens)
            continue
        virtual = node_token[node] < 0
        slot = pslot
        if not virtual:
            slot = len(tokens)
            order[node] = slot
            tokens.append(node_token[node])
            depth.append(d)
            parent.append(pslot)
        stack.append((node, pslot, d, True))
        for child in reversed(list(children[node].values())):
            stack.append((child, slot, d + 1 if not virtual else 0, False))
    end_pre = np.zeros(len(tokens), dtype=np.int64)
    real = order >= 0
    end_pre[order[real]] = end[real]
    return _Forest(
        tokens=np.asarray(tokens, dtype=np.int64),
        depth=np.asarray(depth, dtype=np.int64),
        parent=np.asarray(parent, dtype=np.int64),
        end=end_pre,
        sample_nodes=[order[np.asarray(p, dtype=np.int64)] for p in raw_paths],
    )


def _lcp(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix of two root paths (node ids): the nodes they share."""
    m = min(a.shape[0], b.shape[0])
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.shape[0] else m


def _group_samples(forest: _Forest, cap: int) -> list[list[int]]:
    """Samples in reverse DFS order of their last node, cut greedily into groups of path union <= cap.

    Between two nodes in preorder lies only their common ancestor's subtree, so of all samples
    taken so far the one taken just before shares the longest prefix with the next: a sample adds
    ``len - lcp(previous)`` nodes to its group. Reverse order puts a sample before the samples that
    are its prefixes (a call-by-call trajectory's earlier calls), which then join it at no cost, even
    when it alone is longer than ``cap`` (such a sample opens a group of its own).
    """
    nodes = forest.sample_nodes
    order = sorted(range(len(nodes)), key=lambda i: (int(nodes[i][-1]), i), reverse=True)
    groups: list[list[int]] = []
    size = 0
    for k, i in enumerate(order):
        added = int(nodes[i].shape[0]) - (_lcp(nodes[order[k - 1]], nodes[i]) if k else 0)
        if not groups or (added > 0 and size + added > cap):
            groups.append([i])
            size = int(nodes[i].shape[0])
        else:
            groups[-1].append(i)
            size += added
    return groups


def pack_samples(
    samples: Sequence[Sample],
    *,
    token_budget: int = 8192,
    max_tree_tokens: int = 8192,
    max_context: int | None = None,
    merge: bool = True,
) -> PackedBatch:
    """Merge ``samples`` into prefix trees and pack them into micro-batches of ``token_budget`` tokens.

    ``merge=False`` gives the baseline: every sample its own chain, as many per micro-batch as
    the budget allows. The cut rule and its bounds are in the module docstring.
    """
    if not samples:
        raise DataError("cannot pack an empty batch")
    if token_budget < 1 or max_tree_tokens < 2:
        raise DataError("token_budget must be >= 1 and max_tree_tokens >= 2")
    for i, s in enumerate(samples):
        if max_context is not None and len(s.token_ids) > max_context:
            raise DataError(f"sample {i} has {len(s.token_ids)} tokens, over the model context {max_context}")
        if len(s.loss_mask) != len(s.token_ids) or len(s.advantages) != len(s.token_ids):
            raise DataError(f"sample {i}: per-token lists do not match its {len(s.token_ids)} tokens")
        if min(s.token_ids) < 0:
            raise DataError(f"sample {i} has a negative token id")
    forest = _build_forest([s.token_ids for s in samples], merge)

    # A part is a group of samples forwarded as the union of their root paths: no node that no
    # sample of the part needs, and never more nodes than the part's samples have tokens.
    groups = _group_samples(forest, min(max_tree_tokens, token_budget))
    parts = [np.unique(np.concatenate([forest.sample_nodes[i] for i in g])) for g in groups]

    batches: list[list[int]] = []
    size = 0
    for k, nodes in enumerate(parts):
        if not batches or size + nodes.shape[0] > token_budget:
            batches.append([])
            size = 0
        batches[-1].append(k)
        size += int(nodes.shape[0])
    micro = [_assemble(forest, [parts[k] for k in b], [groups[k] for k in b]) for b in batches]
    return PackedBatch(
        micro_batches=micro,
        num_samples=len(samples),
        unmerged_tokens=sum(len(s.token_ids) for s in samples),
        merged_tokens=int(forest.tokens.shape[0]),
        forwarded_tokens=sum(m.num_tokens for m in micro),
        stats={"trees": float(np.count_nonzero(forest.parent < 0)), "parts": float(len(parts))},
    )


def _assemble(forest: _Forest, parts: list[np.ndarray], samples_by_part: list[list[int]]) -> MicroBatch:
    """Concatenate parts (each a sorted, ancestor-closed node set: itself a valid preorder) into one row."""
    samples: list[int] = []
    token_index: list[np.ndarray] = []
    parents: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    base = 0
    for seg, owned in zip(parts, samples_by_part, strict=True):
        for i in owned:  # searchsorted maps global node ids to their slot in the sorted part
            samples.append(i)
            token_index.append(np.searchsorted(seg, forest.sample_nodes[i]) + base)
        gp = forest.parent[seg]
        parents.append(np.where(gp >= 0, np.searchsorted(seg, np.maximum(gp, 0)) + base, -1))
        ends.append(np.searchsorted(seg, forest.end[seg], side="left") + base)
        base += int(seg.shape[0])
    nodes = np.concatenate(parts)
    return MicroBatch(
        input_ids=forest.tokens[nodes],
        position_ids=forest.depth[nodes],
        parent=np.concatenate(parents),
        subtree_end=np.concatenate(ends),
        samples=samples,
        token_index=token_index,
    )
