"""Opening a file that came from elsewhere (a shared run record, a checkpoint folder, a dataset a record
names): only a regular file is read.

A FIFO would make ``open`` wait for a writer that never comes, a device (``/dev/zero``) would never
end, nor would some "regular" files of /proc and /sys (``/proc/self/pagemap``: 256 GB of them). So what
is not a regular file, outside /proc and /sys, is refused from its ``stat``, never opened (opening a
serial device toggles its lines); the file is then opened without blocking and checked again on the
descriptor that is read (the name may have changed in between: what is checked is what is read); and,
where a name of ours is being read (``latest.json``, ``weights.npz``), not through a symlink.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from dorylus_py.errors import DataError

PSEUDO_FILESYSTEMS = ("/proc", "/sys")  # their "files" describe the machine, some without end: never data


def open_regular(path: str | os.PathLike, where: str | None = None, symlinks: bool = False):
    """``path`` open for reading in binary, a regular file (DataError otherwise, naming ``where``);
    ``symlinks``: a symlink is followed (else refused). FileNotFoundError if there is nothing there."""
    where = where or str(path)
    try:
        _check(os.stat(path, follow_symlinks=symlinks).st_mode, path, where)
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | (0 if symlinks else os.O_NOFOLLOW))
    except FileNotFoundError:
        raise
    except OSError as e:  # access denied, a symlink put there since: there, but not to be read
        what = "a symlink (refused)" if e.errno == errno.ELOOP else "unreadable"
        raise DataError(f"{where}: {what} ({e.strerror})") from None
    try:
        _check(os.fstat(fd).st_mode, path, where)
    except DataError:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def in_pseudo_filesystem(path: str | os.PathLike) -> bool:
    """``path``, its links resolved, lies in /proc or /sys."""
    real = str(Path(path).resolve())
    return any(real == root or real.startswith(root + "/") for root in PSEUDO_FILESYSTEMS)


def _check(mode: int, path, where: str) -> None:
    if stat.S_ISLNK(mode):
        raise DataError(f"{where}: a symlink (refused)")
    if not stat.S_ISREG(mode) or in_pseudo_filesystem(path):
        raise DataError(f"{where}: not a regular file ({_kind(mode)})")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "a file of /proc or /sys" if stat.S_ISREG(mode) else "not a plain file"
