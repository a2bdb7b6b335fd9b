"""Checkpoints: weights, Adam's state and the epoch, kept in the partition store they trained on.

``STORE/checkpoints/epoch-NNNNNN.npz`` per checkpoint and ``STORE/checkpoints/latest.json`` naming
the newest with its size and SHA-256; STORE is a local folder or an ``s3://`` prefix. A file is
complete before ``latest.json`` points at it, so a reader never sees half a checkpoint.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_file
from dorylus_py.checksum import sha256_file
from dorylus_py.errors import DataError
from dorylus_py.jsonfile import read_json
from dorylus_py.partition import s3


def checkpoint_root(store: str) -> str:
    return f"{str(store).rstrip('/')}/checkpoints"


def refuse_to_delete_checkpoints(store) -> None:
    """Raise if replacing ``store`` would delete checkpoints: the weights of training runs, which
    re-partitioning cannot bring back."""
    root = checkpoint_root(str(store))
    if s3.is_s3(root):
        found = s3.count_objects(root)
    else:
        found = sum(1 for p in Path(root).rglob("*") if p.is_file()) if Path(root).is_dir() else 0
    if found:
        raise DataError(f"{root}: holds {found} checkpoint files that --overwrite would delete; move them away first, "
                        "or pass --delete-checkpoints as well")


def save_checkpoint(root: str, epoch: int, arrays: dict[str, np.ndarray]) -> str:
    """Write ``arrays`` (and ``epoch``) as the newest checkpoint under ``root``; return its address."""
    name = f"epoch-{epoch:06d}.npz"
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        with open(path, "wb") as f:
            np.savez(f, epoch=np.array(epoch, np.int64), **arrays)
        latest = {"epoch": epoch, "file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}
        if s3.is_s3(root):
            (Path(tmp) / "latest.json").write_text(json.dumps(latest) + "\n")
            s3.put_file(root, name, path)
            s3.put_file(root, "latest.json", Path(tmp) / "latest.json")
        else:
            Path(root).mkdir(parents=True, exist_ok=True)
            with atomic_file(Path(root) / name) as dest:
                dest.write_bytes(path.read_bytes())
            with atomic_file(Path(root) / "latest.json") as dest:
                dest.write_text(json.dumps(latest) + "\n")
    return f"{root}/{name}"


def load_checkpoint(root: str) -> dict[str, np.ndarray]:
    """The newest checkpoint under ``root``, checked against ``latest.json``."""
    with tempfile.TemporaryDirectory() as tmp:
        if s3.is_s3(root):
            latest = read_json(s3.fetch(root, "latest.json", Path(tmp) / "latest.json"), DataError, "missing")
            path = s3.fetch(root, latest["file"], Path(tmp) / latest["file"], latest["bytes"], latest["sha256"])
        else:
            latest = read_json(Path(root) / "latest.json", DataError, "missing: no checkpoint written yet")
            path = Path(root) / latest["file"]
            if not path.exists() or sha256_file(path) != latest["sha256"]:
                raise DataError(f"{path}: missing or does not match latest.json")
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k].copy() for k in z.files}
