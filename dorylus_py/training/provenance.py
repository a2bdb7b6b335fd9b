"""The data a run trained on, noted in its record, and the check before ``predict`` or ``--resume`` reads
it again without being told which data to read (``--data``).

At training, ``config.json`` notes beside each path the run read (``data``, and ``sources``'
``features``, ``labels``, ``masks``) what was there, as ``checksums.FIELD = {kind, bytes, sha256}``:

- ``file``: the file's bytes;
- ``store``: a prepared store (a folder with ``manifest.json``, or ``s3://``): what its manifest says
  of the data (``checkpoint.store_content``: the counts and the size and SHA-256 of every file, which
  the store's loader then checks; not the timings, so the same data prepared again matches);
- ``folder``: another dataset folder (Dorylus binary files, OGB): every regular file under it, by
  relative path, size and SHA-256 (a ``.bsnap`` path stands for its folder, which is what is read).

Later, a recorded path is read only if it holds exactly that: a regular file or a folder (never a FIFO,
a device or anything in /proc or /sys), of the noted size, then the noted SHA-256; a file is read
no further than its noted size. The path is looked for as written, then in the record's own folder
under its last name (a record shared with its data inside). Otherwise, and for a record from before
checksums were noted, one line says to pass ``--data PATH``.

What this does and does not protect (docs/architecture.md, Security): a record's ``config.json`` is
whatever its author wrote, checksums included, so a checksum cannot make a record's data trustworthy.
It makes the data a run is predicted or resumed on the data it trained on, and it keeps a record from
steering a read to a file whose contents its author does not already have (a user's file, a FIFO,
``/proc/kcore``). What makes a hostile record's own data harmless is that every reader is safe on any
bytes: no pickle (``torchfile.py``), sizes checked before anything is allocated.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from pathlib import Path

from dorylus_py import s3
from dorylus_py.checksum import sha256_open
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.regular_file import in_pseudo_filesystem, open_regular

FIELDS = {"data": "dataset", "features": "--features file", "labels": "--labels file", "masks": "--masks file"}
MAX_MANIFEST = 64 << 20  # a store's manifest.json: kilobytes per partition
MAX_FOLDER_FILES = 100_000  # files hashed in one dataset folder


def recorded_paths(config: dict) -> dict[str, str]:
    """The paths a run's configuration names (``data``, and the side files in ``sources``), by field; a
    bundled graph's name (``datasets.py``: ``cora`` where no such file is) as the file it stands for."""
    from dorylus_py.datasets import resolve

    sources = config.get("sources") if isinstance(config.get("sources"), dict) else {}
    data = config.get("data")
    paths = {"data": str(resolve(data)) if isinstance(data, str) else data,
             **{k: sources.get(k) for k in FIELDS if k != "data"}}
    return {k: v for k, v in paths.items() if v is not None}


def note(paths: dict[str, str]) -> dict[str, dict]:
    """``checksums`` of a run's configuration: what each of ``paths`` (field -> path) holds now."""
    return {field: digest(path) for field, path in paths.items()}


def follow(run_dir: Path, config: dict) -> dict[str, str]:
    """The path to read for each path field of ``config`` (a record's ``config.json``): the recorded path,
    or its namesake in ``run_dir``, holding what ``checksums`` says. ConfigError (pass --data) otherwise."""
    paths = recorded_paths(config)
    where = run_dir / "config.json"
    sums = config.get("checksums")
    if not paths:
        return {}
    if not isinstance(sums, dict):
        raise ConfigError(f"{where}: notes no checksum of the data the run trained on (a record from before "
                          "dorylus noted them), so it is not read from there; pass --data PATH")
    return {field: _follow(run_dir, field, path, sums.get(field)) for field, path in paths.items()}


def _follow(run_dir: Path, field: str, path, noted) -> str:
    where, what = run_dir / "config.json", FIELDS[field]
    redo = "pass --data PATH" + (" with its --features, --labels and --masks" if field != "data" else "")
    if not isinstance(path, str) or not path:
        raise ConfigError(f"{where}: its {what} is {str(path)[:40]!r}, not a path; {redo}")
    expected = _noted(noted, where, what, redo)
    name = Path(path).name
    shipped = [] if s3.is_s3(path) or name in ("", ".", "..") else [str(run_dir / name)]  # in the record itself
    candidates = list(dict.fromkeys([path, *shipped]))
    problems = []
    for candidate in candidates:
        if not s3.is_s3(candidate) and not os.path.lexists(candidate):
            continue
        try:
            found = digest(candidate, expected)
        except DataError as e:
            problems.append(str(e))
            continue
        if found == expected:
            return candidate
        problems.append(f"{candidate}: not the {what} the run in {run_dir} trained on ({_difference(found, expected)})")
    if not problems:
        raise ConfigError(f"{path}: the {what} {where} names is not there (nor in {run_dir}); {redo}")
    raise ConfigError(f"{problems[0]}; {redo}")


def _difference(found: dict, noted: dict) -> str:
    if found["kind"] != noted["kind"]:
        return f"a {found['kind']} now, config.json notes a {noted['kind']}"
    if found["kind"] == "store":
        return "its manifest lists other data than config.json notes"
    if found["bytes"] != noted["bytes"]:
        return f"{found['bytes']:,} bytes now, config.json notes {noted['bytes']:,}"
    return "its SHA-256 differs from config.json's"


def _noted(noted, where: Path, what: str, redo: str) -> dict:
    if not (isinstance(noted, dict) and set(noted) == {"kind", "bytes", "sha256"}
            and noted["kind"] in ("file", "store", "folder") and type(noted["bytes"]) is int and noted["bytes"] >= 0
            and isinstance(noted["sha256"], str) and re.fullmatch(r"[0-9a-f]{64}", noted["sha256"])):
        raise ConfigError(f"{where}: no checksum of its {what} ({{kind, bytes, sha256}}); {redo}")
    return noted


# --- what a path holds --------------------------------------------------------------------------------


def digest(path: str, expected: dict | None = None) -> dict:
    """``{kind, bytes, sha256}`` of what ``path`` holds (see the module's docstring). With ``expected``,
    what cannot match it (another kind, another size) is not hashed: its ``sha256`` is None."""
    if s3.is_s3(path):
        text = s3.read_small(path, "manifest.json", MAX_MANIFEST)
        if text is None:
            raise DataError(f"{path}: no manifest.json (not a store made by `dorylus prepare`)")
        return _store(text, f"{path}/manifest.json")
    p = Path(path)
    if p.name.endswith(".bsnap") and not p.is_dir():
        p = p.parent  # what is read is the folder's three files
    if in_pseudo_filesystem(p):
        raise DataError(f"{path}: lies in /proc or /sys: not a dataset")
    try:
        mode = os.stat(p).st_mode
    except OSError as e:
        raise DataError(f"{path}: unreadable ({e.strerror})") from None
    if stat.S_ISDIR(mode) and (p / "manifest.json").exists():
        with open_regular(p / "manifest.json", symlinks=True) as f:
            text = f.read(MAX_MANIFEST + 1)
        if len(text) > MAX_MANIFEST:
            raise DataError(f"{p / 'manifest.json'}: larger than {MAX_MANIFEST:,} bytes: not a store's manifest")
        return _store(text, str(p / "manifest.json"))
    if stat.S_ISDIR(mode):
        return _folder(p, expected)
    return {**_file(p, expected), "kind": "file"}


def _store(text: bytes, where: str) -> dict:
    from dorylus_py.checkpoint import store_content

    try:
        manifest = json.loads(text)
        if not isinstance(manifest, dict):
            raise ValueError("not an object")
        sha256, size = store_content(manifest)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise DataError(f"{where}: not a store's manifest ({str(e)[:80]})") from None
    return {"kind": "store", "bytes": size, "sha256": sha256}


def _file(path: Path, expected: dict | None) -> dict:
    """Size and SHA-256 of a regular file, read no further than ``expected``'s size."""
    with open_regular(path, symlinks=True) as f:
        size = os.fstat(f.fileno()).st_size
        if expected is not None and size != expected["bytes"]:
            return {"bytes": size, "sha256": None}
        return {"bytes": size, "sha256": sha256_open(f, size)}


def _folder(root: Path, expected: dict | None) -> dict:
    """Every regular file under ``root`` (links followed, each folder once), hashed in path order: one
    line per file of its relative path, size and SHA-256, hashed in turn."""
    files = sorted(_walk(root, root, set()))
    total = sum(size for _, _, size in files)
    if expected is not None and (expected["kind"] != "folder" or total != expected["bytes"]):
        return {"kind": "folder", "bytes": total, "sha256": None}
    lines = "".join(f"{rel}\0{size}\0{_file(path, None)['sha256']}\n" for rel, path, size in files)
    return {"kind": "folder", "bytes": total, "sha256": _sha256_bytes(lines.encode())}


def _walk(root: Path, folder: Path, seen: set) -> list[tuple[str, Path, int]]:
    st = os.stat(folder)
    if (st.st_dev, st.st_ino) in seen:
        return []
    seen.add((st.st_dev, st.st_ino))
    found = []
    for entry in os.scandir(folder):
        path = Path(entry.path)
        if in_pseudo_filesystem(path):
            raise DataError(f"{path}: lies in /proc or /sys: not a dataset's")
        try:
            st = os.stat(path)
        except OSError as e:
            raise DataError(f"{path}: unreadable ({e.strerror})") from None
        if stat.S_ISDIR(st.st_mode):
            found += _walk(root, path, seen)
        elif stat.S_ISREG(st.st_mode):
            found.append((path.relative_to(root).as_posix(), path, st.st_size))
        else:
            raise DataError(f"{path}: not a regular file or a folder")
        if len(found) > MAX_FOLDER_FILES:
            raise DataError(f"{root}: more than {MAX_FOLDER_FILES:,} files: not a dataset folder")
    return found


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
