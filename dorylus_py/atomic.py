"""Write files and folders so that a failure leaves nothing half-written behind."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike):
    """Yield a temporary path beside ``path``; rename it onto ``path`` only if the block succeeds."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the result is an ordinary file
        os.replace(tmp, path)
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


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask
