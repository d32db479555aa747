"""A data file's identity by its whole content, hashed once per machine.

A stage's key names its input files by `file_identity(path)`: the file's size and the SHA-256 of
all of its bytes, so a file changed anywhere (its middle too) gives new keys. Hashing a 7 GB
training file takes a minute, so the digest is cached under the file's `file_stamp`: its real
path, size, inode, and modification and status-change times in ns. A rewrite changes the status-
change time (ctime) even when a copy tool restores the mtime (`cp -p`, `rsync -a --inplace`) and
no user can set it back, so a changed file never reuses its old digest; a file that changed while
it was being hashed is hashed again and its digest not cached. The device number is left out: a
network file system numbers its mount differently on each client, and a cache in a shared home
must be found from every node.

The cache lives in `$TASER_FILE_HASH_CACHE`, else `$XDG_CACHE_HOME/taser/file-hashes` (else
`~/.cache/...`): one small JSON file per (file, version). Nothing breaks without it (an unwritable
cache is only slower).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

from taser.io import atomic_open, file_stamp

log = logging.getLogger(__name__)

CACHE_ENV = "TASER_FILE_HASH_CACHE"
_memo: dict[tuple, dict] = {}  # this process's digests, by the same stat key as the cache


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "taser" / "file-hashes"


_stat_key = file_stamp


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def file_identity(path: str | os.PathLike) -> dict:
    """{"size", "sha256"} of the file's whole content (cached under its `file_stamp`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"input file not found: {path}")
    key = _stat_key(path)
    if key in _memo:
        return dict(_memo[key])
    cached = cache_dir() / (hashlib.sha1(json.dumps(key).encode()).hexdigest() + ".json")
    try:
        stored = json.loads(cached.read_text())
        if stored.get("size") == key[1] and len(stored.get("sha256", "")) == 64:
            _memo[key] = {"size": stored["size"], "sha256": stored["sha256"]}
            return dict(_memo[key])
    except (OSError, ValueError):
        pass
    if key[1] > 1 << 30:
        log.info("hashing %s (%.1f GB) once for this machine's stage keys", path, key[1] / 1e9)
    identity = {"size": key[1], "sha256": _sha256(path)}
    if _stat_key(path) != key:  # written to while it was read: neither cache nor trust this digest
        raise RuntimeError(f"{path} changed while it was being hashed; rerun once whatever writes it has finished")
    _memo[key] = identity
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(cached) as f:
            json.dump({**identity, "path": key[0]}, f)
    except OSError as error:
        log.debug("file-hash cache not written (%s): %s", cached, error)
    return dict(identity)
