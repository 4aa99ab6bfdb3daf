"""A small, documented language-mixing detector over decoded text.

Letters are sorted into Unicode scripts by their character names (LATIN, CYRILLIC, ...);
Han, Hiragana and Katakana count as one script, CJK, since Japanese mixes them by design.
Code (fenced blocks and `inline spans`) is ignored: identifiers are Latin in every language.
A text is *mixed* when a second script holds at least ``min_share`` of its letters (or, with
``expected`` scripts, when any unexpected script does). Digits, punctuation and symbols do not
count. This is a heuristic for a process penalty, not a language identifier.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from collections.abc import Collection

_CODE = re.compile(r"```.*?(```|$)|`[^`\n]*`", re.DOTALL)
_MERGE = {"CJK": "CJK", "HIRAGANA": "CJK", "KATAKANA": "CJK", "HALFWIDTH": "CJK"}


def script_of(ch: str) -> str | None:
    """The script name of a letter, or None for anything that is not a letter."""
    if not ch.isalpha():
        return None
    try:
        first = unicodedata.name(ch).split(" ", 1)[0]
    except ValueError:
        return None
    return _MERGE.get(first, first)


def script_counts(text: str) -> Counter[str]:
    """Letters per script, outside code spans."""
    counts: Counter[str] = Counter()
    for ch in _CODE.sub(" ", text):
        s = script_of(ch)
        if s is not None:
            counts[s] += 1
    return counts


def is_language_mixed(
    text: str,
    *,
    expected: Collection[str] | None = None,
    min_share: float = 0.1,
    min_letters: int = 4,
) -> bool:
    """Whether ``text`` mixes scripts beyond ``min_share`` of its letters (see module doc)."""
    if not 0.0 < min_share <= 1.0:
        raise ValueError(f"min_share must be in (0, 1], got {min_share}")
    counts = script_counts(text)
    total = sum(counts.values())
    if total < min_letters:
        return False
    big = {s for s, n in counts.items() if n / total >= min_share}
    if expected is not None:
        allowed = {e.upper() for e in expected}
        return bool(big - allowed)
    return len(big) > 1
