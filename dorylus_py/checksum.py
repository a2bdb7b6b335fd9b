"""SHA-256 of a file, read in blocks: what manifests record and loaders check."""

from __future__ import annotations

import hashlib
from pathlib import Path


def sha256_file(path: Path, block: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(block):
            h.update(chunk)
    return h.hexdigest()
