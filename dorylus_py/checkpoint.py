"""Checkpoints: weights, Adam's state and the epoch, kept where the driver writes them.

``ROOT/epoch-NNNNNN.npz`` per checkpoint and ``ROOT/latest.json`` naming the newest with its size and
SHA-256, the few before it likewise, and the job's fingerprint; ROOT is a local folder or an ``s3://``
prefix. A file is complete (written, flushed to disk, renamed) before ``latest.json`` points at it, so
a reader never sees half a checkpoint, even after a power loss; one that cannot be read for any reason
is passed over for the newest intact one before it, with a line saying so.

Nothing read back is trusted. ``latest.json`` (at most :data:`MAX_INDEX_BYTES`) must fit its schema,
types included, fingerprint and all; a file name is used only if it is exactly ``epoch-NNNNNN.npz``, and
neither it nor ``latest.json`` may be a symlink, so a checkpoint folder (or an S3 prefix someone else
can write) cannot make a resume read or write outside it. Before any array is made, each ``.npy``
member's header must be a plain numeric array whose shape and dtype make exactly the member's size in
the zip, and the members together must fit the model (each ``TENSOR:FIELD`` at most the tensor's
elements) or, without the model's shapes, the file's own size: a zip bomb or a header claiming 2^42
floats is refused at once. The fingerprint (the partition store's manifest, the model, its layer
widths, the partition count) ties a checkpoint to its job: a resume of other data or another model is
refused with one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np

from dorylus_py import s3
from dorylus_py.atomic import atomic_file
from dorylus_py.checksum import sha256_file, sha256_open
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.regular_file import open_regular

log = logging.getLogger(__name__)
LATEST = "latest.json"
NAME = re.compile(r"epoch-\d{6}\.npz")
_TEMP = re.compile(r"\.(?:epoch-\d{6}\.npz|latest\.json)\.[a-z0-9_]{8}\.tmp")  # atomic_file's, left by a kill
KEEP = 4  # checkpoints latest.json lists (the newest and those before it, to fall back on)
MAX_INDEX_BYTES = 64 * 1024  # latest.json: a few hundred bytes
MAX_MEMBERS = 4096  # arrays in one checkpoint: 5 per weight tensor
MAX_HEADER = 4096  # an .npy header's bytes (numpy writes 128)
_FINGERPRINT = {"store": str, "model": str, "widths": list, "partitions": int}


def checkpoint_name(epoch: int) -> str:
    return f"epoch-{epoch:06d}.npz"


def is_checkpoint_file(name: str) -> bool:
    """Whether ``name`` (in a checkpoint folder) is one dorylus writes there: what --overwrite may delete."""
    return bool(NAME.fullmatch(name) or name == LATEST or _TEMP.fullmatch(name))


def fingerprint(manifest: dict, model: str, widths: list[int]) -> dict:
    """What a checkpoint belongs to: the partition store (a hash of what its manifest says of the data:
    every file's checksum, the counts, the feature dtype; not where it came from or how long it took),
    the model and its layer widths, the partition count."""
    return {"store": store_content(manifest)[0][:32], "model": model, "widths": [int(w) for w in widths],
            "partitions": int(manifest["partitions"])}


def store_content(manifest: dict) -> tuple[str, int]:
    """SHA-256 (and length) of what a prepared store's ``manifest`` says of its data: every file's checksum,
    the counts, the feature dtype; not where it came from or how long it took, so preparing the same data
    again gives the same."""
    content = {k: manifest.get(k) for k in ("nodes", "edges", "features", "classes", "summary", "feature_dtype",
                                            "partitions", "parts")}
    text = json.dumps(content, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(text).hexdigest(), len(text)


def model_shapes(cfg, widths: list[int]) -> dict[str, tuple[int, ...]]:
    """The weight tensors, by name, of the model ``cfg`` (a TrainConfig) asks for at ``widths``: what
    bounds the arrays its checkpoints may hold."""
    from dorylus_py.models import spec_of

    return {t.name: tuple(t.shape) for t in spec_of(cfg, widths).tensors()}


def save_checkpoint(root: str, epoch: int, arrays: dict[str, np.ndarray], job: dict) -> str:
    """Write ``arrays`` (and ``epoch``) as the newest checkpoint under ``root``, for the job of
    fingerprint ``job``; return its address. The checkpoints listed before it are kept only if they are
    this job's; an index that is there but unreadable is an error, not a fresh start."""
    _fingerprint(job, "the job's fingerprint")
    name = checkpoint_name(epoch)
    previous = _latest(root, missing_ok=True)
    if previous is not None and previous["fingerprint"] != job:
        log.warning("%s/%s: listed another job's checkpoints; they are no longer listed", root, LATEST)
        previous = None
    kept = [] if previous is None else [_entry(previous)] + previous["previous"]
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


def load_checkpoint(root: str, job: dict | None = None,
                    shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, np.ndarray]:
    """The newest intact checkpoint under ``root``: a newest one that cannot be read, whatever the
    reason, is passed over with a line saying so. ``job``: the fingerprint it must carry (ConfigError
    if not); ``shapes``: the model's weight tensors by name, which bound every array read."""
    latest = _latest(root)
    if job is not None and latest["fingerprint"] != job:
        raise ConfigError(f"{root}: its checkpoints belong to another job ({_difference(latest['fingerprint'], job)}); "
                          "resume with the data and model they were made with, or start a new run")
    problems = []
    for entry in [_entry(latest)] + latest["previous"]:
        try:
            arrays = _read(root, entry, shapes)
        except Exception as e:  # noqa: BLE001  (any failure to read one candidate: it is damaged)
            problems.append(str(e) if isinstance(e, DataError) else f"{root}/{entry['file']}: unreadable "
                            f"({type(e).__name__}: {str(e)[:80]})")
            continue
        if problems:
            log.warning("%s; resuming from %s (epoch %d) instead", "; ".join(problems), entry["file"], entry["epoch"])
        return arrays
    raise DataError(f"{root}: no intact checkpoint ({'; '.join(problems)})")


# --- latest.json -----------------------------------------------------------------------------------


def _latest(root: str, missing_ok: bool = False) -> dict | None:
    """``latest.json`` of ``root``, checked against its schema. Only an index that is not there at all is
    "no checkpoint yet" (None with ``missing_ok``); one unreadable, refused or damaged is an error."""
    where = f"{root}/{LATEST}"
    try:
        if s3.is_s3(root):  # ranged: a huge object there is refused without being downloaded
            text = s3.read_small(root, LATEST, MAX_INDEX_BYTES)
            if text is None:
                raise s3.Missing(where)
        else:
            text = _read_small(Path(root) / LATEST, where)
    except (FileNotFoundError, s3.Missing):
        if missing_ok:
            return None
        raise DataError(f"{where}: missing: no checkpoint written yet") from None
    try:
        latest = json.loads(text)
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{where}: not valid JSON ({getattr(e, 'msg', e)})") from None
    return _index(latest, where)


def _read_small(path: Path, where: str) -> bytes:
    """The bytes of the small regular file ``path``, not through a symlink (FileNotFoundError if absent)."""
    with open_regular(path, where) as f:
        data = f.read(MAX_INDEX_BYTES + 1)
    if len(data) > MAX_INDEX_BYTES:
        raise DataError(f"{where}: larger than {MAX_INDEX_BYTES} bytes: not a checkpoint index")
    return data


def _index(latest, where: str) -> dict:
    """``latest.json``'s schema: the newest entry's fields, ``fingerprint`` (required) and ``previous``
    (a list of entries), nothing else, each of its type."""
    if not isinstance(latest, dict):
        raise DataError(f"{where}: not a checkpoint index")
    unknown = sorted(set(latest) - {"epoch", "file", "bytes", "sha256", "fingerprint", "previous"})
    if unknown:
        raise DataError(f"{where}: unknown field {unknown[0][:40]!r}")
    if "fingerprint" not in latest:
        raise DataError(f"{where}: no fingerprint (which job its checkpoints belong to); refusing to resume from it")
    previous = latest.get("previous", [])
    if not isinstance(previous, list) or len(previous) > KEEP - 1:
        raise DataError(f"{where}: 'previous' is not a list of at most {KEEP - 1} checkpoint entries")
    return _entry(latest, where) | {"fingerprint": _fingerprint(latest["fingerprint"], where),
                                    "previous": [_entry(e, where) for e in previous]}


def _fingerprint(value, where: str) -> dict:
    if not isinstance(value, dict) or set(value) != set(_FINGERPRINT) or any(
            type(value[k]) is not t for k, t in _FINGERPRINT.items()) or not all(
            type(w) is int for w in value["widths"]):
        raise DataError(f"{where}: the fingerprint is not {{store, model, widths: [int], partitions: int}}")
    return value


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


# --- one checkpoint file ---------------------------------------------------------------------------


def _read(root: str, entry: dict, shapes: dict | None) -> dict[str, np.ndarray]:
    name = entry["file"]  # a checked name: a plain file of this folder
    where = f"{root}/{name}"
    with tempfile.TemporaryDirectory() as tmp:
        if s3.is_s3(root):
            path = s3.fetch(root, name, Path(tmp) / name, entry["bytes"], entry["sha256"])
        else:
            path = Path(root) / name
        try:
            f = open_regular(path, where)
        except FileNotFoundError:
            raise DataError(f"{where}: missing") from None
        with f:  # one open file: what is checked is what is read
            size = os.fstat(f.fileno()).st_size
            if size != entry["bytes"] or sha256_open(f, size) != entry["sha256"]:
                raise DataError(f"{path}: missing or does not match {LATEST}")
            f.seek(0)
            arrays = read_npz(f, where, shapes, size)
    if "epoch" not in arrays or arrays["epoch"].shape != () or int(arrays["epoch"]) != entry["epoch"]:
        raise DataError(f"{where}: holds no epoch {entry['epoch']}")
    return arrays


def read_npz(f, where: str, shapes: dict | None, file_bytes: int, wanted: set[str] | None = None
             ) -> dict[str, np.ndarray]:
    """The arrays of the ``.npz`` open as ``f``, each member's size checked before it is read: its header
    must give exactly the member's size in the zip; with ``shapes`` (tensor -> shape), member ``T`` or
    ``T:FIELD`` may hold at most T's elements (``epoch``: one), and its size in the zip is checked against
    that before even its header is read; without, all members together at most ``file_bytes`` (what
    stored members take). ``wanted``: the only members read (others are passed over unopened). Any
    failure is a DataError naming the file."""
    try:
        z = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, NotImplementedError) as e:
        raise DataError(f"{where}: not a zip file ({_reason(e)})") from None
    with z:
        members = z.infolist()
        if len(members) > MAX_MEMBERS or len({m.filename for m in members}) != len(members):
            raise DataError(f"{where}: {len(members)} members, or some twice")
        if shapes is None and sum(m.file_size for m in members) > file_bytes:
            raise DataError(f"{where}: its members claim {sum(m.file_size for m in members):,} bytes, more than the "
                            f"{file_bytes:,} of the file (compressed? dorylus stores them as they are)")
        arrays = {}
        for m in members:
            if not m.filename.endswith(".npy") or m.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raise DataError(f"{where}: member {m.filename[:40]!r} is not an .npy array, stored or deflated")
            key = m.filename[:-4]
            if wanted is not None and key not in wanted:
                continue
            name, limit = f"{where}:{key[:40]}", _limit(key, shapes)
            if limit is not None and m.file_size > MAX_HEADER + 16 + 8 * limit:
                raise DataError(f"{name}: {m.file_size:,} bytes, more than the model's {limit:,} elements take")
            try:
                with z.open(m) as member:
                    arrays[key] = _member(member, m.file_size, name, limit)
            except (zipfile.BadZipFile, zlib.error, OSError, EOFError, RuntimeError, NotImplementedError) as e:
                raise DataError(f"{name}: unreadable ({_reason(e)})") from None
    return arrays


def _limit(key: str, shapes: dict | None) -> int | None:
    """The most elements the member ``key`` (``T`` in a weights file, ``T:FIELD`` in a checkpoint) may hold
    for a model of ``shapes``."""
    if shapes is None:
        return None
    if key == "epoch":
        return 1
    tensor = key.partition(":")[0]
    if tensor not in shapes:
        raise DataError(f"{key[:40]}: not an array of this model")
    return math.prod(shapes[tensor])


def _member(member, size: int, where: str, limit: int | None) -> np.ndarray:
    """One ``.npy`` member, its header checked against ``size`` (its bytes in the zip) and ``limit``
    (elements) before its data is read."""
    try:
        version = np.lib.format.read_magic(member)
        if version not in ((1, 0), (2, 0), (3, 0)):
            raise ValueError(f"npy version {version}")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, fortran, dtype = read_header(member, max_header_size=MAX_HEADER)
    except (ValueError, SyntaxError, TypeError) as e:
        raise DataError(f"{where}: not an .npy header ({_reason(e)})") from None
    if dtype.hasobject or dtype.kind not in "biuf" or dtype.itemsize > 8 or len(shape) > 8 or min(shape, default=0) < 0:
        raise DataError(f"{where}: {dtype} x {shape[:8]} is not a plain numeric array")
    count = math.prod(shape)
    data_bytes = count * dtype.itemsize
    if member.tell() + data_bytes != size:
        raise DataError(f"{where}: its header claims shape {shape[:4]} of {dtype} ({data_bytes:,} bytes), but "
                        f"{size - member.tell():,} bytes follow it")
    if limit is not None and count > limit:
        raise DataError(f"{where}: {count:,} elements, more than the model's {limit:,}")
    data = member.read(data_bytes)
    if len(data) != data_bytes:
        raise DataError(f"{where}: cut short")
    return np.frombuffer(data, dtype).reshape(shape, order="F" if fortran else "C").copy()


def _reason(e: BaseException) -> str:
    """``e`` in a few words, on one line."""
    line = (str(e).strip().splitlines() or [""])[0][:80]
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def _difference(theirs, ours: dict) -> str:
    names = {"store": "the prepared data", "model": "the model", "widths": "the layer widths",
             "partitions": "the partition count"}
    return ", ".join(f"{names[k]} differ{'s' if k != 'widths' else ''}: {str(theirs.get(k))[:40]} here, {ours[k]} now"
                     for k in names if theirs.get(k) != ours[k])
