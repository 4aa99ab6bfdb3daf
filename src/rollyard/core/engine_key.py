"""The credential of the engines rollyard starts (see ``engines.access`` for who checks it).

The key is ``ROLLYARD_ENGINE_KEY`` when set (use it for an engine on another machine: the same
value on both), else a random key kept in ``~/.config/rollyard/engine.key`` (0600, made on first
use), so that the engines and gateways of one host user agree without passing it around. Here, in
``core``, because the simulator's calibration talks to an engine too.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from rollyard.core.errors import ConfigError

KEY_ENV = "ROLLYARD_ENGINE_KEY"
KEY_FILE_ENV = "ROLLYARD_ENGINE_KEY_FILE"


def key_file() -> Path:
    if path := os.environ.get(KEY_FILE_ENV):
        return Path(path)
    config = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config) / "rollyard" / "engine.key"


def engine_key() -> str:
    """This host user's engine key (see the module docstring); made on first use."""
    if key := os.environ.get(KEY_ENV):
        return key
    path = key_file()
    try:
        if key := path.read_text().strip():
            return key
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot read the engine key {path}: {e}") from e
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_urlsafe(32) + "\n")
        try:
            os.link(tmp, path)  # never replaces a key another process made meanwhile
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        return path.read_text().strip()
    except OSError as e:
        raise ConfigError(f"cannot create the engine key {path}: {e}; or set {KEY_ENV}") from e


def engine_headers() -> dict[str, str]:
    """The header every request to an engine carries (vLLM's own ``--api-key`` scheme)."""
    return {"Authorization": f"Bearer {engine_key()}"}
