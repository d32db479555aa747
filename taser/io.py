"""Atomic outputs: every stage writes to a temporary path and renames it on success.

A killed or failing process therefore never leaves a half-written file (or checkpoint
directory) that a later stage would take as complete. Before the rename, the output (and, for a
directory, everything in it) is given the permissions the user's umask grants a new file or
directory, as `open` and `mkdir` would: `tempfile` makes its files and directories private
(0600 / 0700), and so do some writers (safetensors writes 0600), which on a shared cluster
would hide results from the user's group.

A rename is atomic against a killed process, not against a crashed node: on a local disk with
delayed allocation (ext4, xfs) or a parallel file system (Lustre, GPFS), a node that dies seconds
after a rename can leave the new name pointing at an empty or short file. So the output's data
(every file of a directory) is flushed to the disk before the rename, and the parent directory
after it (`durable`), as databases do.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def cache_home() -> Path:
    """Where taser keeps what it derives from a file once per machine: `$TASER_CACHE`, else
    `$XDG_CACHE_HOME/taser`, else `~/.cache/taser` (a shared home: once per cluster)."""
    if os.environ.get("TASER_CACHE"):
        return Path(os.environ["TASER_CACHE"])
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")) / "taser"


def file_stamp(path: str | os.PathLike) -> tuple:
    """(real path, size, mtime ns, ctime ns, inode): what tells this version of a file from any
    rewrite of it without reading it, the key of every cache derived from a file. The ctime changes
    at every write and cannot be set back (a copy tool restores only the mtime); the device number
    is left out (a network mount is numbered differently on each client)."""
    path = Path(path)
    st = path.stat()
    return (str(path.resolve()), st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


def current_umask() -> int:
    """This process's umask, read without changing it where the system says it (Linux), else set
    and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def publish_modes(path: Path) -> None:
    """Give `path` (and, for a directory, everything below it) the modes the umask grants new
    files and directories; executable files keep their execute bits (as far as the umask allows)."""
    umask = current_umask()
    items = [path]
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            items += [Path(root) / name for name in dirs + files]
    for item in items:
        if item.is_symlink():
            continue
        if item.is_dir():
            os.chmod(item, 0o777 & ~umask)
        else:
            executable = os.stat(item).st_mode & 0o111
            os.chmod(item, (0o777 if executable else 0o666) & ~umask)


def _fsync_path(path: Path, directory: bool = False) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    except OSError:
        return  # a directory some file systems will not open: nothing to flush
    try:
        os.fsync(fd)
    except OSError as error:  # EINVAL: this file system has no fsync for it (some FUSE mounts): nothing more can be done
        if error.errno not in (errno.EINVAL, errno.EOPNOTSUPP):
            raise
    finally:
        os.close(fd)


def durable(path: str | os.PathLike) -> None:
    """Flush `path` to the disk: a file's data, or a directory tree's files and directories."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        for root, _dirs, files in os.walk(path):
            for name in files:
                if not os.path.islink(os.path.join(root, name)):
                    _fsync_path(Path(root) / name)
            _fsync_path(Path(root), directory=True)
    elif path.is_file():
        _fsync_path(path)


def clear_leftovers(directory: str | os.PathLike) -> list[Path]:
    """Remove what killed writers left in `directory` (at any depth): the temporary files and
    directories of `atomic_path` / `atomic_dir` (`.<name>.<random>.tmp`, `.old`). Only for a
    directory no other process writes into (a stage under its lock). The paths removed."""
    removed = []
    for root, dirs, files in os.walk(directory):
        for name in [*dirs, *files]:
            if name.startswith(".") and name.endswith((".tmp", ".old")) and name.count(".") >= 3:
                path = Path(root) / name
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed.append(path)
        dirs[:] = [d for d in dirs if (Path(root) / d).exists()]
    return removed


def _tmp_name(path: Path) -> Path:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; move it onto `path` only if the block succeeds."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(path)
    try:
        yield tmp
        publish_modes(tmp)
        durable(tmp)
        os.replace(tmp, path)
        _fsync_path(path.parent, directory=True)
    finally:
        if tmp.exists():
            tmp.unlink()


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", **kwargs) -> Iterator[IO]:
    """Open a temporary file for writing; it replaces `path` only when the block succeeds."""
    if "b" not in mode:
        kwargs.setdefault("encoding", "utf-8")
    with atomic_path(path) as tmp:
        with open(tmp, mode, **kwargs) as f:
            yield f


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, previous: str | os.PathLike | None = None) -> Iterator[Path]:
    """Yield a fresh temporary directory; it replaces directory `path` when the block succeeds.

    The old directory (if any) is moved aside first and deleted only after the new one is in
    place, so at every moment `path` is either the old complete directory or the new one. With
    `previous`, the old directory is kept there instead (replacing an older one) as a fallback.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        publish_modes(tmp)
        durable(tmp)
        old = None
        if path.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".old", dir=path.parent))
            os.rmdir(old)
            os.replace(path, old)
        os.replace(tmp, path)
        _fsync_path(path.parent, directory=True)
        if old is not None:
            if previous is not None:
                previous = Path(previous)
                if previous.exists():
                    shutil.rmtree(previous, ignore_errors=True)
                os.replace(old, previous)
                _fsync_path(previous.parent, directory=True)
            else:
                shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
