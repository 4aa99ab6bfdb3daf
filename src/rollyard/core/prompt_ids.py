"""A prompt's token ids that remember what was already done with their history.

Each turn of a conversation posts the whole history's ids to the engine again and builds a
turn record over them; done from scratch, both cost time in proportion to the history (at 30k
tokens: ~0.45 ms to write the ids as JSON, ~0.16 ms to check them), on the gateway's event loop,
every turn. A ``PromptIds`` is an ordinary list of ints that also carries

- the JSON text of its first ids (made when it was last posted, inherited by the
  prompt that extends it), so ``ids_json_parts`` writes only the ids after them; the text is
  kept as pieces (one per turn, shared by every later prompt of the conversation), so a body
  is joined once, around them, not first the array and then the body (~150 KB at 30k ids); and
- ``checked``: how many of its first ids were part of a turn that was built and checked
  already (the previous prompt and completion), so a turn re-checks only the new ones.

Both facts are about a prefix, so they stay true while ids are appended, and ``truncate``
keeps them true when ids are cut off; nothing here survives a copy (``list(ids)``, slices and
``+`` give plain lists, which are simply done in full). Code that changes an id in place must
not use one.
"""

from __future__ import annotations

from collections.abc import Iterable

import pydantic_core

# At most this many pieces of JSON text are kept per prompt; past it they are joined into one
# (once every ``_MAX_PIECES`` turns: a piece per turn is added).
_MAX_PIECES = 64


class PromptIds(list[int]):
    __slots__ = ("_json", "checked")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        super().__init__(ids)
        # (pieces, n): the JSON of ids[:n] as pieces without brackets, each ids' text
        # comma-separated; one attribute, so a reader in another thread never pairs one
        # turn's pieces with another's count
        self._json: tuple[tuple[bytes, ...], int] = ((), 0)
        self.checked = 0

    @classmethod
    def extending(cls, prompt: list[int], completion: list[int]) -> PromptIds:
        """``prompt + completion`` of a recorded turn, to be extended by the next prompt: what
        ``prompt`` knew of its JSON is kept, and all of it counts as checked."""
        # ``+`` first: CPython copies a list subclass (a ``PromptIds`` prompt) item by item
        # through its iterator, an exact list in one C loop; ``+`` makes an exact list in one
        # (at 30k ids: ~0.83x the time of copying the subclass, then appending)
        ids = cls(prompt + shared_ids(completion))
        if isinstance(prompt, PromptIds):
            ids._json = prompt._json
        ids.checked = len(ids)
        return ids

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` ids. What is known of the JSON of more than ``n`` is dropped
        (the ids written after them may differ); a turn that failed after its render appended
        to its conversation's list is cut back to the recorded prompt with this."""
        if len(self) <= n:
            return
        del self[n:]
        if self._json[1] > n:
            self._json = ((), 0)
        self.checked = min(self.checked, n)

    def unchecked(self) -> list[int]:
        """The ids after the checked prefix."""
        return self[self.checked :] if self.checked else self


# One int object per token id, shared by every conversation's lists (grown to the largest id
# seen). Why: a conversation's ids otherwise point at int objects allocated turn by turn all over
# the heap, and every turn copies its history's list (an incref per id) and frees the previous
# one (a decref per id); at 64 conversations of 30k tokens those cache misses cost ~0.7 ms a
# turn against ~0.2 ms with shared ids (measured), and 32 bytes an id of memory.
_SHARED: list[int] = list(range(1 << 16))
MAX_SHARED_ID = (1 << 20) - 1  # the largest vocabularies have ~260k ids


def shared_ids(ids: Iterable[int]) -> list[int]:
    """``ids`` as a list of the shared int objects (a list with an id outside any vocabulary's
    range, ``0 .. MAX_SHARED_ID``, is copied as it is)."""
    ids = ids if isinstance(ids, list) else list(ids)
    if not ids:
        return []
    table, top = _SHARED, max(ids)
    if min(ids) < 0 or top > MAX_SHARED_ID:
        return list(ids)
    if top >= len(table):
        table = _grow(top)
    return list(map(table.__getitem__, ids))


def _grow(top: int) -> list[int]:
    global _SHARED
    table = _SHARED
    bigger = table + list(range(len(table), min(max(top + 1, 2 * len(table)), MAX_SHARED_ID + 1)))
    _SHARED = bigger  # one assignment: a thread reading the old table still reads valid ints
    return bigger


def ids_json_parts(ids: list[int]) -> list[bytes]:
    """``ids`` as a JSON array, in pieces to be joined (into the body they go in); for a
    ``PromptIds``, only the ids after its known prefix are written, and the pieces are
    remembered for the prompt that extends it."""
    if not isinstance(ids, PromptIds):
        return [pydantic_core.to_json(ids)]
    pieces, known = ids._json
    if known > len(ids):  # not a prefix any more (ids were removed): written afresh
        pieces, known = (), 0
        ids._json = (pieces, known)
    if known < len(ids):
        new = pydantic_core.to_json(ids[known:] if known else ids)[1:-1]
        pieces = (*pieces, new) if len(pieces) < _MAX_PIECES else (b",".join((*pieces, new)),)
        ids._json = (pieces, len(ids))
    out = [b"["]
    for i, piece in enumerate(pieces):
        out += (b",", piece) if i else (piece,)
    out.append(b"]")
    return out
