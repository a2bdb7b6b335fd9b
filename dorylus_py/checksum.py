"""SHA-256 of a file, read in blocks: what manifests record and loaders check."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    with open(path, "rb") as f:
        return sha256_open(f, block=block)


def sha256_open(f, limit: int | None = None, block: int = 1 << 22) -> str:
    """SHA-256 of the open file ``f``, from where it stands; with ``limit``, of at most ``limit`` + 1 bytes
    (a file longer than it was said to be hashes to something else, without being read to its end)."""
    h = hashlib.sha256()
    left = float("inf") if limit is None else limit + 1
    while left > 0 and (chunk := f.read(int(min(block, left)))):
        h.update(chunk)
        left -= len(chunk)
    return h.hexdigest()
