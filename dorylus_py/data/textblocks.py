"""Numeric text (a dataset's csv and edge-list files) read in bounded blocks, whatever the file holds.

A hostile file must not take the machine: 255 KB of gzip can hold one line of 256 MiB. So a line is
capped (:data:`MAX_LINE_BYTES`); the text is cut into blocks of whole lines of about :data:`BLOCK_BYTES`
as it is read, a partial line waiting as a list of pieces (joined once, never re-copied while no
newline comes); and each block is parsed straight to the dtype asked for. A block costs a few times its
text (the text, its positions of separators, the parsed values), never a multiple of the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO, Iterator

import numpy as np

from dorylus_py.errors import DataError

MAX_LINE_BYTES = 1 << 20  # one vertex's row: 100 k features of ten characters each
BLOCK_BYTES = 1 << 22  # text parsed at a time (a block may hold one line more)
DEFLATE_MAX_RATIO = 1032  # deflate's most: 258 bytes from 2 bits, so a .gz holds at most this times its size
NL, COMMA, HASH = ord("\n"), ord(","), ord("#")
_TO_COMMAS = bytes.maketrans(b"\n", b",")
_BLANKS = (ord(" "), ord("\t"), ord("\r"), NL)


def line_blocks(f: BinaryIO, where, block_bytes: int | None = None,
                max_line: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(number of its first line, text)`` for consecutive blocks of whole lines of the binary stream ``f``,
    about ``block_bytes`` each (at most :data:`BLOCK_BYTES`; the last may lack its newline). A line longer than
    ``max_line`` is a DataError as soon as it is."""
    block_bytes = min(block_bytes or BLOCK_BYTES, BLOCK_BYTES)
    line, pieces, held = 1, [], 0
    while True:
        chunk = f.read(block_bytes)
        cut = chunk.rfind(b"\n") + 1 if chunk else 0
        if chunk and not cut:  # no newline yet: the line goes on
            held += len(chunk)
            if held > max_line:
                raise too_long(where, line, max_line)
            pieces.append(chunk)
            continue
        text = b"".join([*pieces, memoryview(chunk)[:cut]])  # one copy
        if text:
            yield line, text
            line += text.count(b"\n")
        if not chunk:
            return
        pieces, held = [chunk[cut:]], len(chunk) - cut


def check_line_lengths(ends: np.ndarray, where, first_line: int, max_line: int = MAX_LINE_BYTES) -> None:
    """No line (``ends``: the positions of a block's newlines) is longer than ``max_line``."""
    long = np.flatnonzero(np.diff(ends, prepend=-1) > max_line + 1)
    if len(long):
        raise too_long(where, first_line + int(long[0]), max_line)


def too_long(where, line: int, max_line: int) -> DataError:
    return DataError(f"{where}:{line}: a line longer than {max_line:,} bytes (no row is that long)")


def parse_csv(text: bytes, columns: int, dtype, where, first_line: int) -> np.ndarray:
    """``text`` (whole lines of comma-separated numbers) as a ``(lines, columns)`` array of ``dtype``
    (floating: ``nan`` and empty fields allowed); a ragged or unparsable line is a DataError."""
    if not text.endswith(b"\n"):
        text += b"\n"
    raw = np.frombuffer(text, np.uint8)
    ends = np.flatnonzero(raw == NL)  # (lines,)
    check_line_lengths(ends, where, first_line)
    commas = np.flatnonzero(raw == COMMA)
    per_line = np.searchsorted(commas, ends) - np.searchsorted(commas, np.r_[0, ends[:-1] + 1])
    del commas
    ragged = np.flatnonzero(per_line != columns - 1)
    if len(ragged):
        i = int(ragged[0])
        raise DataError(f"{where}:{first_line + i}: {per_line[i] + 1} values, but the file's lines have {columns} "
                        "(a ragged csv)")
    floating = np.issubdtype(dtype, np.floating)
    body = text.translate(_TO_COMMAS)[:-1]
    if floating and (b",," in body or body.startswith(b",") or body.endswith(b",") or not body):
        body = b"nan" + body if body.startswith(b",") or not body else body  # OGB's unlabelled: nothing
        body = body.replace(b",,", b",nan,").replace(b",,", b",nan,")
        body = body + b"nan" if body.endswith(b",") else body
    values = _numbers(body, len(ends) * columns, dtype, b",")
    if values is None:
        bad = _first_unparsable(text, floating, b",")
        raise DataError(f"{where}:{first_line + bad}: not {'numbers' if floating else 'integers'} separated by commas")
    return values.reshape(len(ends), columns)


def parse_pairs(text: bytes, where, first_line: int) -> np.ndarray:
    """``text`` (whole lines of an edge list: two integers each, separated by blanks; ``#`` starts a comment;
    empty lines skipped) as an ``(edges, 2)`` int64 array."""
    if not text.endswith(b"\n"):
        text += b"\n"
    if b"#" in text:
        text = _without_comments(text)
    raw = np.frombuffer(text, np.uint8)
    blank = np.isin(raw, _BLANKS)
    starts = np.flatnonzero(~blank & np.r_[True, blank[:-1]])  # where each field begins
    signs = np.flatnonzero((raw == ord("-")) | (raw == ord("+")))
    inner = signs[~np.isin(signs, starts)]  # "1-2" would otherwise read as two numbers
    if len(inner):
        line = first_line + text.count(b"\n", 0, int(inner[0]))
        raise DataError(f"{where}:{line}: not an edge list of 'src dst' integer pairs")
    del blank, signs
    ends = np.flatnonzero(raw == NL)
    check_line_lengths(ends, where, first_line)
    per_line = np.diff(np.searchsorted(starts, ends), prepend=0)
    ragged = np.flatnonzero((per_line != 2) & (per_line != 0))
    if len(ragged):
        i = int(ragged[0])
        raise DataError(f"{where}:{first_line + i}: {per_line[i]} values; an edge list has 2 per line (src dst)")
    values = _numbers(text, len(starts), np.int64, b" ")
    if values is None:
        bad = _first_unparsable(text, False, None)
        raise DataError(f"{where}:{first_line + bad}: not an edge list of 'src dst' integer pairs")
    return values.reshape(-1, 2)


def _numbers(body: bytes, count: int, dtype, sep: bytes) -> np.ndarray | None:
    """Exactly ``count`` numbers of ``dtype`` from ``body`` (nothing left over), or None."""
    if count == 0:
        return np.zeros(0, dtype)
    try:  # parses to dtype as it goes (no float64 copy); raises on anything after the last number. From a
        # str: 3x faster than from bytes; latin-1 keeps it one byte a character, whatever the file holds
        values = np.fromstring(body.decode("latin-1"), dtype=dtype, sep=sep.decode())
    except ValueError:
        return None
    return values if values.size == count else None


def _without_comments(text: bytes) -> bytes:
    """``text`` with each line's ``#`` and what follows it blanked."""
    raw = np.frombuffer(text, np.uint8).copy()
    hashes = np.flatnonzero(raw == HASH)
    ends = np.flatnonzero(raw == NL)
    line = np.searchsorted(ends, hashes)
    first = np.r_[True, line[1:] != line[:-1]]  # a line's first '#'
    edges = np.zeros(len(raw) + 1, np.int8)
    edges[hashes[first]] = 1
    edges[ends[line[first]]] = -1
    raw[np.cumsum(edges[:-1], dtype=np.int8).astype(bool)] = ord(" ")
    return raw.tobytes()


def _first_unparsable(text: bytes, floating: bool, sep: bytes | None) -> int:
    """The index of the first line of ``text`` with a value that is not a number (an integer); an error
    path, over one bounded block."""
    for i, line in enumerate(text.split(b"\n")):
        for field in line.split(sep):
            try:
                float(field or b"nan") if floating else int(field)
            except ValueError:
                return i
    return 0


def gzip_capacity(path: Path, bytes_per_row: int) -> int:
    """The most rows of ``bytes_per_row`` bytes or more that the .gz at ``path`` can hold, by its size:
    a count from a header is checked against it before anything of that count is made."""
    return path.stat().st_size * DEFLATE_MAX_RATIO // max(1, bytes_per_row)
