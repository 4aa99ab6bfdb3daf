"""The minimal /etc every sandbox sees: a few copied host entries and generated user files."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
from pathlib import Path

from rollyard.core.ids import new_id
from rollyard.sandbox import _fs
from rollyard.sandbox._net import RESOLV_CONF

# Host /etc entries a program needs to run; everything else in /etc (shadow, ssh keys, ...) is absent.
ETC_ENTRIES = (
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "localtime",
    "mime.types",
    "ssl",
    "ca-certificates",
    "python3",
    "python3.11",
    "inputrc",
    "bash.bashrc",
)


def build_etc(root: Path, uid: int, home: str) -> Path:
    """Build the sandboxes' /etc: copies of the few host entries programs need plus a generated
    passwd/group/hosts. The directory is named by a hash of the sources' metadata, so a changed
    host (a new ld.so.cache) gets a new one, running sandboxes keep theirs, and an unchanged
    host reuses the existing one at no cost."""
    files = {
        "passwd": f"root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"sandbox:x:{uid}:{uid}:sandbox:{home}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "group": f"root:x:0:\nsandbox:x:{uid}:\nnogroup:x:65534:\n",
        "hosts": "127.0.0.1 localhost sandbox\n::1 localhost\n",
        "nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
        "resolv.conf": RESOLV_CONF,  # slirp4netns's DNS forwarder, for sandboxes with network
    }
    key = hashlib.sha256(repr(sorted(files.items())).encode())
    for name in ETC_ENTRIES:
        with contextlib.suppress(OSError):
            st = os.lstat(Path("/etc") / name)
            key.update(f"{name}:{st.st_mode}:{st.st_size}:{st.st_mtime_ns};".encode())
    final = root / f".etc-{key.hexdigest()[:16]}"
    if final.is_dir():
        return final
    tmp = root / f".etc-tmp-{new_id('etc')}"
    tmp.mkdir(mode=0o755)
    for name in ETC_ENTRIES:
        src = Path("/etc") / name
        if src.is_symlink():
            os.symlink(os.readlink(src), tmp / name)
        elif src.is_dir():
            _fs.copy_tree(src, tmp / name, owner=None)
            os.chmod(tmp / name, 0o755)
        elif src.is_file():
            shutil.copyfile(src, tmp / name)
            os.chmod(tmp / name, 0o644)
    for name, text in files.items():
        (tmp / name).write_text(text)
        os.chmod(tmp / name, 0o644)
    try:
        os.rename(tmp, final)
    except OSError:  # built meanwhile by another provider on this root
        _fs.remove_tree(tmp)
    return final
