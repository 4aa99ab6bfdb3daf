"""The host's Python inside sandboxes, read-only, so hidden tests (pytest) and Python agents run there.

Commands say ``python3``. Where the sandbox shares the host's filesystem (the ``local``
provider) this interpreter's bin directory simply goes first on PATH. In an isolated sandbox
the interpreter's prefixes are bound at the same paths when every parent directory is
searchable by others; otherwise (e.g. a pyenv under a private /root) the sandbox's own
/usr/bin/python3 of the same minor version runs with this environment's site-packages bound
read-only on PYTHONPATH.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

from pydantic import BaseModel, ConfigDict

SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"


class HostPython(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ro_binds: list[tuple[Path, Path]]
    env: dict[str, str]


def searchable(path: Path) -> bool:
    """Whether an unprivileged uid can reach ``path`` (every ancestor has o+x)."""
    try:
        return all(os.stat(p).st_mode & 0o001 for p in [path, *path.parents])
    except OSError:
        return False


def host_python(*, isolated: bool) -> HostPython:
    """Binds and environment that make ``python3`` in a sandbox see this environment's packages."""
    base_env = {"PYTHONDONTWRITEBYTECODE": "1"}
    bin_dir = Path(sys.executable).parent
    if not isolated:
        return HostPython(ro_binds=[], env={**base_env, "PATH": f"{bin_dir}:{SYSTEM_PATH}"})
    prefixes = sorted({Path(sys.prefix), Path(sys.base_prefix)})
    if all(searchable(p) for p in prefixes):
        binds = [(p, p) for p in prefixes if p != Path("/")]
        return HostPython(ro_binds=binds, env={**base_env, "PATH": f"{bin_dir}:{SYSTEM_PATH}"})
    paths = sysconfig.get_paths()
    site = sorted({Path(paths["purelib"]), Path(paths["platlib"])})
    return HostPython(
        ro_binds=[(p, p) for p in site],
        env={**base_env, "PATH": SYSTEM_PATH, "PYTHONPATH": ":".join(map(str, site))},
    )
