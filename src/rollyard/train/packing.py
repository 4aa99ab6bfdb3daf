"""Prefix-tree packing: merge samples that share token prefixes into trees, pack trees by a token budget.

Pure code (numpy only). Samples are inserted into one token trie, so group members that share a
prompt, and the call-by-call samples of one trajectory (each a prefix of the next), share nodes.
The forest is flattened in DFS preorder, where the ancestors of node ``i`` are exactly the nodes
``j <= i < subtree_end[j]``; that is the whole tree attention mask, and position ids are depths.

Loss terms stay per original (sample, position): ``token_index`` maps every token of every sample
to its packed node, so two samples that share a node share its logits but keep their own masks,
advantages and behaviour logprobs. Token ``t`` is predicted from the node of token ``t-1``.

Long-tree rule: a tree with more than ``max_tree_tokens`` nodes is cut into contiguous DFS ranges
``[a, b)``; each range is forwarded together with the ancestor path of ``a`` (which is all the
context any node of the range needs), so memory stays bounded by the cut size while the result is
unchanged: the ancestors are recomputed, not approximated. Each sample is computed, whole, in the
part that holds its last token (that part holds its full path).
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


def _cut_tree(forest: _Forest, start: int, stop: int, max_tree_tokens: int) -> list[tuple[int, int]]:
    """Contiguous DFS ranges of one tree; each range plus its first node's ancestors fits the cap.

    A range owns at least half the cap (so a path longer than the cap does not degrade into one
    node per part); within the allowed window the cut goes where the next range starts shallowest,
    i.e. where the least ancestor path has to be recomputed.
    """
    if stop - start <= max_tree_tokens:
        return [(start, stop)]
    ranges: list[tuple[int, int]] = []
    a = start
    min_own = max(1, max_tree_tokens // 2)
    while a < stop:
        max_own = max(min_own, max_tree_tokens - int(forest.depth[a]))
        if stop - a <= max_own:
            ranges.append((a, stop))
            break
        lo, hi = a + min_own, a + max_own  # candidate cut points b (next range starts at b)
        cand = forest.depth[lo : hi + 1]
        best = lo + int(np.flatnonzero(cand == cand.min())[-1])
        ranges.append((a, best))
        a = best
    return ranges


def _ancestors(forest: _Forest, node: int) -> list[int]:
    path: list[int] = []
    p = int(forest.parent[node])
    while p >= 0:
        path.append(p)
        p = int(forest.parent[p])
    return path[::-1]


def pack_samples(
    samples: Sequence[Sample],
    *,
    token_budget: int = 8192,
    max_tree_tokens: int = 8192,
    max_context: int | None = None,
    merge: bool = True,
) -> PackedBatch:
    """Merge ``samples`` into prefix trees and pack them into micro-batches of ``token_budget`` tokens.

    ``merge=False`` gives the baseline: every sample its own chain, one per micro-batch unless
    the budget allows more. A part larger than the budget gets a micro-batch of its own.
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

    roots = np.flatnonzero(forest.parent < 0)
    parts: list[tuple[list[int], int, int]] = []  # (ancestor path, range start, range stop)
    for r in roots:
        for a, b in _cut_tree(forest, int(r), int(forest.end[r]), max_tree_tokens):
            parts.append((_ancestors(forest, a), a, b))

    # Each sample is computed in the part that holds its last token.
    last = np.array([int(nodes[-1]) for nodes in forest.sample_nodes], dtype=np.int64)
    starts = np.array([p[1] for p in parts], dtype=np.int64)
    owner = np.searchsorted(starts, last, side="right") - 1
    by_part: list[list[int]] = [[] for _ in parts]
    for i, p in enumerate(owner):
        by_part[int(p)].append(i)

    groups: list[list[int]] = []
    size = 0
    for k, (anc, a, b) in enumerate(parts):
        n = len(anc) + (b - a)
        if not groups or size + n > token_budget:
            groups.append([])
            size = 0
        groups[-1].append(k)
        size += n
    micro = [_assemble(forest, [parts[k] for k in g], [by_part[k] for k in g]) for g in groups]
    micro = [m for m in micro if m.samples]
    return PackedBatch(
        micro_batches=micro,
        num_samples=len(samples),
        unmerged_tokens=sum(len(s.token_ids) for s in samples),
        merged_tokens=int(forest.tokens.shape[0]),
        forwarded_tokens=sum(m.num_tokens for m in micro),
        stats={"trees": float(len(roots)), "parts": float(len(parts))},
    )


def _assemble(
    forest: _Forest, parts: list[tuple[list[int], int, int]], samples_by_part: list[list[int]]
) -> MicroBatch:
    """Concatenate parts (each ancestors + a DFS range, itself a valid preorder) into one row."""
    nodes_all: list[np.ndarray] = []
    samples: list[int] = []
    token_index: list[np.ndarray] = []
    offset = 0
    for (anc, a, b), owned in zip(parts, samples_by_part, strict=True):
        nodes = np.concatenate([np.asarray(anc, dtype=np.int64), np.arange(a, b, dtype=np.int64)])
        local = np.full(int(forest.tokens.shape[0]), -1, dtype=np.int64)
        local[nodes] = np.arange(nodes.shape[0]) + offset
        for i in owned:
            idx = local[forest.sample_nodes[i]]
            if (idx < 0).any():  # would mean a path is not closed under ancestors: a packing bug
                raise DataError(f"internal: sample {i} is not wholly inside its part")
            samples.append(i)
            token_index.append(idx)
        nodes_all.append(nodes)
        offset += nodes.shape[0]
    parents: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    base = 0
    for seg in nodes_all:  # seg is sorted and closed under ancestors: searchsorted maps global -> local
        gp = forest.parent[seg]
        lp = np.searchsorted(seg, np.maximum(gp, 0))
        parents.append(np.where(gp >= 0, lp + base, -1))
        ends.append(np.searchsorted(seg, forest.end[seg], side="left") + base)
        base += seg.shape[0]
    nodes = np.concatenate(nodes_all)
    parent = np.concatenate(parents)
    end = np.concatenate(ends)
    return MicroBatch(
        input_ids=forest.tokens[nodes],
        position_ids=forest.depth[nodes],
        parent=parent,
        subtree_end=end,
        samples=samples,
        token_index=token_index,
    )
