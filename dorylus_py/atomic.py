"""Write files and folders so that a failure leaves nothing half-written behind, and replace a folder
without deleting anything the project did not write.

A file is flushed to disk before it is renamed into place, and the folder after, so that even a power
loss leaves either the old file or the whole new one under the name, never a name pointing at a
file whose blocks never reached the disk.

``--overwrite`` of a folder (a run record, a prepared store, keys, a build context) removes only what
an :data:`Owned` test claims, file by file, and never ``rmtree``: a folder that holds anything else (a
user's file, a folder of theirs, a symlink) is refused whole, in one line naming that entry, before
anything is deleted.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path, PurePosixPath
from typing import Callable

from dorylus_py.errors import ConfigError

Owned = Callable[[str, bool], bool]  # (path relative to the folder, "/"-separated; is a folder) -> we wrote it


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
def atomic_dir(path: str | os.PathLike, owned: Owned | set[str] | None = None, private: bool = True):
    """Yield a temporary folder beside ``path``; move it onto ``path`` only if the block succeeds. A
    ``path`` there already is replaced if it is empty or holds only what ``owned`` claims (those files
    are deleted one by one); anything else is refused (ConfigError) and nothing is deleted. ``private``:
    the folder keeps mkdtemp's mode 0700 (keys); else it is an ordinary folder (0777 less the umask)."""
    path = Path(path)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    try:
        if not private:
            os.chmod(tmp, 0o777 & ~_umask())
        yield tmp
        if path.exists() or path.is_symlink():
            remove_owned(path, owned or set())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)  # our own mkdtemp folder


def owned_names(names: set[str]) -> Owned:
    """The files ``names`` (relative paths) and the folders that hold them."""
    folders = {str(p) for n in names for p in PurePosixPath(n).parents if str(p) != "."}
    return lambda rel, is_dir: rel in (folders if is_dir else names)


def foreign(out: Path, owned: Owned | set[str]) -> list[str]:
    """What lies under the folder ``out`` that ``owned`` does not claim (a symlink never is; nor is
    anything inside a folder it does not claim): files first, then folders, each sorted."""
    owned = _as_test(owned)
    found = []
    for top, dirs, files in os.walk(out):  # symlinks to folders are listed, never followed
        skip = set()
        for name in dirs + files:
            p = Path(top) / name
            rel, is_dir = p.relative_to(out).as_posix(), name in dirs and not p.is_symlink()
            if p.is_symlink() or not owned(rel, is_dir):
                found.append((is_dir, rel))
                skip.add(name)
        dirs[:] = [d for d in dirs if d not in skip]
    return [rel for _, rel in sorted(found)]


def check_replaceable(out: Path, owned: Owned | set[str], overwrite: bool, what: str) -> None:
    """Refuse to write the folder ``out`` over anything but what ``owned`` claims (relative paths, or a
    test of them): without ``overwrite`` it must be missing or empty; with it, it may hold those files
    and nothing else (``--overwrite`` of a home folder must not delete the home folder). ``what``: the
    files, in words."""
    if not (out.exists() or out.is_symlink()):
        return
    if out.is_symlink() or not out.is_dir():
        raise ConfigError(f"{out}: not a folder")
    if not overwrite and any(out.iterdir()):
        raise ConfigError(f"{out}: exists and is not empty (pass --overwrite to replace {what})")
    other = foreign(out, owned)
    if other:
        raise ConfigError(f"{out}: holds {len(other)} file(s) that are not {what} ({_some(other)}); --overwrite "
                          "replaces only those: choose an empty or new folder")


def check_replaceable_file(path: Path, ours: Callable[[bytes], bool], overwrite: bool, what: str) -> None:
    """Refuse to write the file ``path`` over anything but an earlier one of ours: without ``overwrite`` it
    must not exist; with it, it must be a regular file whose first 4 KiB ``ours`` claims (a report's mark).
    Its folder must exist. ``what``: such a file, in words."""
    if not path.parent.is_dir():
        raise ConfigError(f"{path.parent}: no such folder (for {path})")
    if not (path.exists() or path.is_symlink()):
        return
    if path.is_symlink() or not path.is_file():
        raise ConfigError(f"{path}: exists and is not a regular file")
    if not overwrite:
        raise ConfigError(f"{path}: exists (pass --overwrite to replace {what})")
    with open(path, "rb") as f:
        head = f.read(4096)
    if not ours(head):
        raise ConfigError(f"{path}: exists and is not {what}; --overwrite replaces only those: choose another file")


def remove_owned(out: Path, owned: Owned | set[str]) -> None:
    """Empty the folder ``out`` of what ``owned`` claims, file by file, deepest first; refuse (before
    deleting anything) if it holds anything else. ``out`` itself stays, empty."""
    if out.is_symlink() or not out.is_dir():
        raise ConfigError(f"{out}: not a folder")
    other = foreign(out, owned)
    if other:
        raise ConfigError(f"{out}: holds {len(other)} file(s) that dorylus did not write ({_some(other)}); "
                          "nothing was deleted")
    owned = _as_test(owned)
    for top, dirs, files in os.walk(out, topdown=False):
        for name, is_dir in [(f, False) for f in files] + [(d, True) for d in dirs]:
            p = Path(top) / name
            if not owned(p.relative_to(out).as_posix(), is_dir):  # appeared since the check: leave it
                continue
            try:
                os.rmdir(p) if is_dir else os.unlink(p)
            except OSError as e:  # a folder holding something new: it stays
                raise ConfigError(f"{p}: could not be removed ({e.strerror}); the rest of {out} was") from None


def _some(names: list[str]) -> str:
    """The first few of ``names``, for an error line."""
    return ", ".join(n[:80] for n in names[:3]) + (", ..." if len(names) > 3 else "")


def _as_test(owned: Owned | set[str]) -> Owned:
    return owned_names(owned) if isinstance(owned, (set, frozenset)) else owned


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
