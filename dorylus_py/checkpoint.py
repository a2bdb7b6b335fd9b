"""Checkpoints: weights, Adam's state and the epoch, kept where the driver writes them.

``ROOT/epoch-NNNNNN.npz`` per checkpoint and ``ROOT/latest.json`` naming the newest with its size and
SHA-256, the few before it likewise, and the job's fingerprint; ROOT is a local folder or an ``s3://``
prefix. A file is complete (written, flushed to disk, renamed) before ``latest.json`` points at it, so
a reader never sees half a checkpoint, even after a power loss; one that fails its checksum anyway is
passed over for the newest intact one before it, with a line saying so.

Nothing in ``latest.json`` is trusted as a path: a file name is used only if it is exactly
``epoch-NNNNNN.npz``, so a checkpoint folder (or an S3 prefix someone else can write) cannot make a
resume read or write outside it. The fingerprint (the partition store's manifest, the model, its layer
widths, the partition count) ties a checkpoint to its job: a resume of other data or another model is
refused with one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import tempfile
from pathlib import Path

import numpy as np

from dorylus_py import s3
from dorylus_py.atomic import atomic_file
from dorylus_py.checksum import sha256_file
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jsonfile import read_json

log = logging.getLogger(__name__)
LATEST = "latest.json"
NAME = re.compile(r"epoch-\d{6}\.npz")
KEEP = 4  # checkpoints latest.json lists (the newest and those before it, to fall back on)


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}.npz"


def fingerprint(manifest: dict, model: str, widths: list[int]) -> dict:
    """What a checkpoint belongs to: the partition store (a hash of what its manifest says of the data:
    every file's checksum, the counts, the feature dtype; not where it came from or how long it took),
    the model and its layer widths, the partition count."""
    content = {k: manifest.get(k) for k in ("nodes", "edges", "features", "classes", "summary", "feature_dtype",
                                            "partitions", "parts")}
    store = hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:32]
    return {"store": store, "model": model, "widths": [int(w) for w in widths], "partitions": int(manifest["partitions"])}


def save_checkpoint(root: str, epoch: int, arrays: dict[str, np.ndarray], job: dict | None = None) -> str:
    """Write ``arrays`` (and ``epoch``) as the newest checkpoint under ``root``, for the job of
    fingerprint ``job``; return its address."""
    name = checkpoint_name(epoch)
    previous = _latest(root, missing_ok=True)
    kept = [] if previous is None else [_entry(previous)] + previous.get("previous", [])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / name
        with open(path, "wb") as f:
            np.savez(f, epoch=np.array(epoch, np.int64), **arrays)
        latest = _entry({"epoch": epoch, "file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)})
        latest |= {"fingerprint": job, "previous": [e for e in kept if e["file"] != name][: KEEP - 1]}
        if s3.is_s3(root):
            (Path(tmp) / LATEST).write_text(json.dumps(latest) + "\n")
            s3.put_file(root, name, path)
            s3.put_file(root, LATEST, Path(tmp) / LATEST)
        else:
            Path(root).mkdir(parents=True, exist_ok=True)
            with atomic_file(Path(root) / name) as dest:
                dest.write_bytes(path.read_bytes())
            with atomic_file(Path(root) / LATEST) as dest:
                dest.write_text(json.dumps(latest) + "\n")
    return f"{root}/{name}"


def load_checkpoint(root: str, job: dict | None = None) -> dict[str, np.ndarray]:
    """The newest intact checkpoint under ``root`` (checked against ``latest.json``; a damaged newest one
    is passed over, with a line saying so); ``job``: the fingerprint it must carry (ConfigError if not)."""
    latest = _latest(root)
    if job is not None and latest.get("fingerprint") not in (None, job):
        raise ConfigError(f"{root}: its checkpoints belong to another job ({_difference(latest['fingerprint'], job)}); "
                          "resume with the data and model they were made with, or start a new run")
    problems = []
    for entry in [latest] + list(latest.get("previous", []))[: KEEP - 1]:
        try:
            arrays = _read(root, _entry(entry))
        except DataError as e:
            problems.append(str(e))
            continue
        if problems:
            log.warning("%s; resuming from %s (epoch %d) instead", "; ".join(problems), entry["file"], entry["epoch"])
        return arrays
    raise DataError(f"{root}: no intact checkpoint ({'; '.join(problems)})")


def _latest(root: str, missing_ok: bool = False) -> dict | None:
    """``latest.json`` of ``root``, checked for form."""
    where = f"{root}/{LATEST}"
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = s3.fetch(root, LATEST, Path(tmp) / LATEST) if s3.is_s3(root) else Path(root) / LATEST
            latest = read_json(path, DataError, "missing: no checkpoint written yet")
        except DataError:
            if missing_ok:
                return None
            raise
    if not isinstance(latest, dict):
        raise DataError(f"{where}: not a checkpoint index")
    _entry(latest, where)
    if not isinstance(latest.get("previous", []), list):
        raise DataError(f"{where}: 'previous' is not a list")
    return latest


def _entry(entry, where: str = "latest.json") -> dict:
    """One checkpoint's entry (epoch, file, bytes, sha256), its file name matching ``epoch-NNNNNN.npz``
    before it is ever used in a path."""
    if not isinstance(entry, dict):
        raise DataError(f"{where}: a checkpoint entry is not an object")
    epoch, name, size, sha = (entry.get(k) for k in ("epoch", "file", "bytes", "sha256"))
    if not (isinstance(name, str) and NAME.fullmatch(name) and type(epoch) is int and name == checkpoint_name(epoch)):
        raise DataError(f"{where}: {str(name)[:60]!r} is not a checkpoint file name (epoch-NNNNNN.npz of its epoch)")
    if type(size) is not int or size < 0 or not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
        raise DataError(f"{where}: {name} has no size and SHA-256")
    return {"epoch": epoch, "file": name, "bytes": size, "sha256": sha}


def _read(root: str, entry: dict) -> dict[str, np.ndarray]:
    name = entry["file"]  # a checked name: a plain file of this folder
    with tempfile.TemporaryDirectory() as tmp:
        if s3.is_s3(root):
            path = s3.fetch(root, name, Path(tmp) / name, entry["bytes"], entry["sha256"])
        else:
            path = Path(root) / name
            if not path.is_file() or path.stat().st_size != entry["bytes"] or sha256_file(path) != entry["sha256"]:
                raise DataError(f"{path}: missing or does not match {LATEST}")
        try:
            with np.load(path, allow_pickle=False) as z:
                arrays = {k: z[k].copy() for k in z.files}
        except (OSError, ValueError) as e:
            raise DataError(f"{root}/{name}: unreadable ({e})") from None
    if "epoch" not in arrays or int(arrays["epoch"]) != entry["epoch"]:
        raise DataError(f"{root}/{name}: holds no epoch {entry['epoch']}")
    return arrays


def _difference(theirs, ours: dict) -> str:
    if not isinstance(theirs, dict):
        return "its fingerprint is unreadable"
    names = {"store": "the prepared data", "model": "the model", "widths": "the layer widths",
             "partitions": "the partition count"}
    return ", ".join(f"{names[k]} differ{'s' if k != 'widths' else ''}: {str(theirs.get(k))[:40]} here, {ours[k]} now"
                     for k in names if theirs.get(k) != ours[k])
