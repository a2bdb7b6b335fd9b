"""Read a JSON file a user handed us, within bounds, with a one-line error naming the file when it is
missing, not a file, too large, too deep or broken.

Whoever wrote the file (a shared run record, a price table, a manifest) may be hostile: only a regular
file is read (a FIFO would hang the reader, a device never end), at most ``max_bytes`` of it, and it is
parsed by the protocol's bounded parser (``protocol/bounded_json.py``: nesting at most 16 deep, no
5,000-digit integer reaching ``int()``). ``NaN`` and the infinities pass: a diverged run's record holds
them. JSON-lines files are read a line at a time, each line within ``max_line_bytes``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from dorylus_py.errors import DataError, DorylusError
from dorylus_py.protocol.bounded_json import FILE_NUMBERS, parse
from dorylus_py.protocol.messages import ProtocolError

MAX_JSON_BYTES = 16 * 2**20  # a whole JSON file: a run record's config or summary, a manifest, a price table
MAX_LINE_BYTES = 2**20  # a line of a .jsonl file (a task row, an epoch with every server's counters)


def read_json(path: str | Path, error: type[DorylusError] = DataError, missing: str = "not found",
              max_bytes: int = MAX_JSON_BYTES):
    """Parsed contents of ``path``; ``error(f"{path}: {missing}")`` if absent, or one line saying what is
    wrong with it."""
    path = Path(path)
    with open_regular(path, error, missing) as f:
        if (size := os.fstat(f.fileno()).st_size) > max_bytes:
            raise error(f"{path}: {size:,} bytes, more than the {max_bytes:,} such a file may have")
        raw = f.read(min(size, max_bytes) + 1)  # the size it says (a file growing meanwhile: cut, and refused)
    return parse_json(raw, path, error, max_bytes)


def read_json_lines(path: str | Path, error: type[DorylusError] = DataError, missing: str = "not found",
                    max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, object]]:
    """``(line number, value)`` of each non-blank line of a JSON-lines file, read a line at a time."""
    path = Path(path)
    with open_regular(path, error, missing) as f:
        for i, line in enumerate(bounded_lines(f, max_line_bytes), 1):
            if line is None:
                raise error(f"{path}:{i}: a line longer than {max_line_bytes:,} bytes")
            if line.strip():
                yield i, parse_json(line, f"{path}:{i}", error, max_line_bytes)


def bounded_lines(f: BinaryIO, max_line_bytes: int) -> Iterator[bytes | None]:
    """Each line of ``f``, or None for a line longer than ``max_line_bytes``, which is read past in
    pieces of that size and never held whole."""
    while line := f.readline(max_line_bytes + 1):
        if len(line) <= max_line_bytes:
            yield line
            continue
        while not line.endswith(b"\n") and (line := f.readline(max_line_bytes + 1)):
            pass
        yield None


def parse_json(raw: bytes, where: str | Path, error: type[DorylusError] = DataError,
               max_bytes: int = MAX_JSON_BYTES):
    """``raw`` parsed within the bounds; ``error`` naming ``where`` if it is not such JSON."""
    try:
        return parse(raw, max_bytes, str(where), FILE_NUMBERS)
    except ProtocolError as e:
        raise error(str(e)) from None


_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device"))


def open_regular(path: Path, error: type[DorylusError] = DataError, missing: str = "not found") -> BinaryIO:
    """``path`` opened for reading, if it is a regular file (checked on the open file, so it cannot be
    swapped in between; opened non-blocking, so a FIFO with no writer does not hang the open)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise error(f"{path}: {missing}") from None
    except OSError as e:
        raise error(f"{path}: cannot be read ({e.strerror})") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((name for test, name in _KINDS if test(mode)), "something else")
        raise error(f"{path}: is {kind}, not a regular file")
    return os.fdopen(fd, "rb")
