"""Write files and folders so that a failure leaves nothing half-written behind.

A file is flushed to disk before it is renamed into place, and the folder after, so that even a power
loss leaves either the old file or the whole new one under the name, never a name pointing at a
file whose blocks never reached the disk.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from dorylus_py.errors import ConfigError


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the result is an ordinary file
        _fsync(tmp)
        os.replace(tmp, path)
        _fsync(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False):
    """Yield a temporary folder beside ``path``; move it onto ``path`` only if the block succeeds."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        yield tmp
        if path.exists() and overwrite:
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def check_replaceable(out: Path, names: set[str], overwrite: bool, what: str) -> None:
    """Refuse to write the folder ``out`` (files ``names``, relative paths) over anything but those files:
    without ``overwrite`` it must be missing or empty; with it, it may hold those files and nothing
    else (``--overwrite`` of a home folder must not delete the home folder). ``what``: the files, in words."""
    if not out.exists():
        return
    if not out.is_dir() or out.is_symlink():
        raise ConfigError(f"{out}: not a folder")
    held = [p for p in out.rglob("*") if not p.is_dir() or p.is_symlink()]
    if held and not overwrite:
        raise ConfigError(f"{out}: exists and is not empty (pass --overwrite to replace {what})")
    other = sorted(str(p.relative_to(out)) for p in held if p.is_symlink() or str(p.relative_to(out)) not in names)
    if other:
        raise ConfigError(f"{out}: holds {len(other)} file(s) that are not {what} (such as {other[0]}); --overwrite "
                          "replaces only those: choose an empty or new folder")


def _fsync(path: str | os.PathLike) -> None:
    """Flush ``path`` (a file, or a folder's entries) to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
