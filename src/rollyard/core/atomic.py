"""A directory made whole or not at all: filled beside its final place, then swapped in."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def replace_dir(out: Path, fill: Callable[[Path], object]) -> None:
    """Call ``fill`` on a fresh sibling directory of ``out``, then swap it in for ``out`` (any old
    content removed); on any failure the sibling is removed and ``out`` is left as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    tmp.chmod(0o755)
    try:
        fill(tmp)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
