"""Opening a file that came from elsewhere (a shared run record, a checkpoint folder, a dataset a record
names): only a regular file is read.

A FIFO would make ``open`` wait for a writer that never comes, a device (``/dev/zero``) or a ``/proc``
file (``/proc/self/pagemap``: 256 GB of "file") would never end. So the file is opened without
blocking, checked on the descriptor that is then read (what is checked is what is read), and, where
a name of ours is being read (``latest.json``, ``weights.npz``), never through a symlink.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from dorylus_py.errors import DataError

PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")  # regular files there describe the machine: never data


def open_regular(path: str | os.PathLike, where: str | None = None, symlinks: bool = False):
    """``path`` open for reading in binary, a regular file (DataError otherwise, naming ``where``);
    ``symlinks``: a symlink is followed (else refused). FileNotFoundError if there is nothing there."""
    where = where or str(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | (0 if symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as e:  # access denied, a symlink where none may be: there, but not to be read
        what = "a symlink (refused)" if e.errno == errno.ELOOP else "unreadable"
        raise DataError(f"{where}: {what} ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode) or (symlinks and in_pseudo_filesystem(path)):
        os.close(fd)
        raise DataError(f"{where}: not a regular file ({_kind(mode)})")
    return os.fdopen(fd, "rb")


def in_pseudo_filesystem(path: str | os.PathLike) -> bool:
    """``path``, its links resolved, lies in /proc, /sys or /dev."""
    real = str(Path(path).resolve())
    return any(real == root or real.startswith(root + "/") for root in PSEUDO_FILESYSTEMS)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return name
    return "a file in /proc, /sys or /dev" if stat.S_ISREG(mode) else "not a plain file"
