"""An OGB node-property dataset folder, as the ``ogb`` package saves it (``ogbn-arxiv``, ``ogbn-products``):

- ``raw/edge.csv.gz``: one ``src,dst`` pair per line (no header); every edge is read in both directions
  (as OGB's loader does for ogbn-products, and its examples for ogbn-arxiv: GCN aggregates in-edges);
- ``raw/node-feat.csv.gz``: one row of F comma-separated floats per vertex;
- ``raw/node-label.csv.gz``: one integer class per vertex (``nan`` or empty: unlabelled);
- ``raw/num-node-list.csv.gz``: the vertex count (``raw/num-edge-list.csv.gz``: the edge count, optional);
- ``split/<name>/{train,valid,test}.csv.gz``: the vertex ids of each split, the split used.

The csv files are read in blocks of lines (:func:`csv_blocks`), never whole: what ``prepare`` streams
costs memory per vertex, not per edge. Every block is checked as it is parsed, so a ragged line, a
non-number or an id out of range is one line naming the file and the line.
"""

from __future__ import annotations

import gzip
import warnings
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from dorylus_py.errors import DataError

SPLIT_FILES = ("train", "valid", "test")  # OGB's names for train, val, test
BLOCK_BYTES = 1 << 23  # decompressed text parsed at a time


def is_ogb_folder(path: str | Path) -> bool:
    """``path`` is a folder in the OGB layout (it has ``raw/edge.csv.gz``)."""
    return (Path(path) / "raw" / "edge.csv.gz").is_file()


def csv_blocks(path: Path, columns: int, dtype, block_bytes: int = BLOCK_BYTES) -> Iterator[np.ndarray]:
    """The rows of a gzipped numeric csv of ``columns`` values per line, as ``(rows, columns)`` arrays of
    ``dtype`` (float: ``nan`` and empty fields allowed), a block of lines at a time."""
    line, rest = 1, b""
    try:
        with gzip.open(path, "rb") as f:
            while True:
                chunk = f.read(block_bytes)
                text = rest + chunk
                cut = len(text) if not chunk else text.rfind(b"\n") + 1
                text, rest = text[:cut], text[cut:]
                if text.strip():
                    rows = parse_lines(text, columns, dtype, path, line)
                    line += text.count(b"\n") + (not text.endswith(b"\n"))
                    yield rows
                if not chunk:
                    return
    except FileNotFoundError:
        raise DataError(f"{path}: missing (an OGB dataset folder has it)") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable .csv.gz ({str(e).strip() or type(e).__name__})") from None


def parse_lines(text: bytes, columns: int, dtype, path: Path, first_line: int) -> np.ndarray:
    """``text`` (whole lines) as a ``(lines, columns)`` array; a ragged or unparsable line is a DataError."""
    if not text.endswith(b"\n"):
        text += b"\n"
    raw = np.frombuffer(text, dtype=np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    starts = np.concatenate(([0], ends[:-1] + 1))
    commas = np.flatnonzero(raw == ord(","))
    per_line = np.searchsorted(commas, ends) - np.searchsorted(commas, starts)
    ragged = np.flatnonzero(per_line != columns - 1)
    if len(ragged):
        i = int(ragged[0])
        raise DataError(f"{path}:{first_line + i}: {per_line[i] + 1} values, but the file's lines have {columns} "
                        "(a ragged csv)")
    floating = np.issubdtype(dtype, np.floating)
    body = text.replace(b"\n", b",")[:-1].decode("ascii", errors="replace")
    if floating:  # OGB writes an unlabelled vertex's label as nan or as nothing
        body = body.replace(",,", ",nan,").replace(",,", ",nan,")
        body = ("nan" + body) if body.startswith(",") else body
        body = (body + "nan") if body.endswith(",") else body
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            values = np.fromstring(body, dtype=np.float64 if floating else np.int64, sep=",")
    except (ValueError, DeprecationWarning):
        values = np.zeros(0)
    if values.size != len(ends) * columns:
        bad = _first_unparsable(text, floating)
        raise DataError(f"{path}:{first_line + bad}: not {'numbers' if floating else 'integers'} separated by commas")
    return values.reshape(len(ends), columns).astype(dtype, copy=False)


def _first_unparsable(text: bytes, floating: bool) -> int:
    """The index of the first line of ``text`` with a value that is not a number (an integer)."""
    for i, line in enumerate(text.splitlines()):
        for field in line.split(b","):
            try:
                float(field or b"nan") if floating else int(field)
            except ValueError:
                return i
    return 0


def first_line_width(path: Path) -> int:
    """The number of comma-separated values on the first line of a gzipped csv."""
    try:
        with gzip.open(path, "rb") as f:
            first = f.readline()
    except FileNotFoundError:
        raise DataError(f"{path}: missing (an OGB dataset folder has it)") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable .csv.gz ({str(e).strip() or type(e).__name__})") from None
    if not first.strip():
        raise DataError(f"{path}: empty")
    return first.count(b",") + 1


def read_column(path: Path, dtype) -> np.ndarray:
    """A one-column csv, whole (``(N,)``): labels, split ids, counts."""
    blocks = list(csv_blocks(path, 1, dtype))
    return np.concatenate(blocks)[:, 0] if blocks else np.zeros(0, dtype)


class OgbFolder:
    """An OGB node-property dataset folder: its counts and per-vertex arrays read at once, its edges and
    features in blocks."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        raw = self.path / "raw"
        counts = read_column(raw / "num-node-list.csv.gz", np.int64)
        if len(counts) != 1:
            raise DataError(f"{raw / 'num-node-list.csv.gz'}: {len(counts)} graphs; only single-graph node-property "
                            "datasets are read")
        self.num_nodes = int(counts[0])
        if self.num_nodes < 1:
            raise DataError(f"{raw / 'num-node-list.csv.gz'}: the graph has no vertices")
        self.num_features = first_line_width(raw / "node-feat.csv.gz")

    @property
    def source(self) -> str:
        return str(self.path)

    def labels(self) -> np.ndarray:
        """(N,) int64, -1 = unlabelled."""
        path = self.path / "raw" / "node-label.csv.gz"
        if path.exists() and first_line_width(path) != 1:
            raise DataError(f"{path}: {first_line_width(path)} labels per vertex; only single-label classification "
                            "is trained (not multi-label tasks such as ogbn-proteins)")
        y = read_column(path, np.float64)
        if len(y) != self.num_nodes:
            raise DataError(f"{path}: {len(y)} labels but num-node-list.csv.gz says {self.num_nodes} vertices")
        known = ~np.isnan(y)
        if (y[known] != np.round(y[known])).any():
            v = int(np.flatnonzero(known & (y != np.round(y)))[0])
            raise DataError(f"{path}:{v + 1}: label {y[v]} is not an integer class")
        labels = np.where(known, y, -1).astype(np.int64)
        negative = np.flatnonzero(known & (y < 0))
        if len(negative):  # -1 would read as unlabelled: refuse it here, where it is still a label
            v = int(negative[0])
            raise DataError(f"{path}:{v + 1}: label {labels[v]} of vertex {v} is out of range (classes count from 0)")
        return labels

    def masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Train, val, test (N,) bool from the one split the folder ships."""
        root = self.path / "split"
        names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        if len(names) != 1:
            raise DataError(f"{root}: {'no split folder' if not names else 'several splits (' + ', '.join(names) + ')'}"
                            "; an OGB dataset folder ships one, split/<name>/{train,valid,test}.csv.gz")
        masks = []
        for name in SPLIT_FILES:
            path = root / names[0] / f"{name}.csv.gz"
            if not path.exists():
                raise DataError(f"{path}: missing (a split needs train, valid and test)")
            ids = read_column(path, np.int64)
            if len(ids) and (ids.min() < 0 or ids.max() >= self.num_nodes):
                bad = ids[(ids < 0) | (ids >= self.num_nodes)][0]
                raise DataError(f"{path}: vertex id {bad} is out of range [0, {self.num_nodes})")
            mask = np.zeros(self.num_nodes, dtype=bool)
            mask[ids] = True
            masks.append(mask)
        return masks[0], masks[1], masks[2]

    def num_edge_records(self) -> int:
        """Directed edges as read (each file edge twice): from num-edge-list.csv.gz, else by counting lines."""
        path = self.path / "raw" / "num-edge-list.csv.gz"
        if path.exists():
            return 2 * int(read_column(path, np.int64).sum())
        return 2 * sum(len(b) for b in csv_blocks(self.path / "raw" / "edge.csv.gz", 2, np.int64))

    def edge_blocks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(src, dst)`` int64 blocks, every edge in both directions, ids checked in range."""
        path, n, line = self.path / "raw" / "edge.csv.gz", self.num_nodes, 1
        for block in csv_blocks(path, 2, np.int64, block_bytes=min(max(1 << 16, 16 * size), 1 << 25)):
            bad = np.flatnonzero(((block < 0) | (block >= n)).any(axis=1))
            if len(bad):
                i = int(bad[0])
                raise DataError(f"{path}:{line + i}: vertex id {block[i].max() if block[i].max() >= n else block[i].min()}"
                                f" is out of range [0, {n}) set by num-node-list.csv.gz")
            line += len(block)
            yield np.concatenate([block[:, 0], block[:, 1]]), np.concatenate([block[:, 1], block[:, 0]])

    def feature_blocks(self, size: int) -> Iterator[np.ndarray]:
        """float32 ``(rows, F)`` blocks, finite, ``N`` rows in all."""
        path, start = self.path / "raw" / "node-feat.csv.gz", 0
        f = self.num_features
        for block in csv_blocks(path, f, np.float32, block_bytes=min(max(1 << 16, 16 * size * f), 1 << 25)):
            bad = ~np.isfinite(block).all(axis=1)
            if bad.any():
                raise DataError(f"{path}:{start + int(np.argmax(bad)) + 1}: a feature is NaN, infinite or missing")
            start += len(block)
            if start > self.num_nodes:
                break
            yield block
        if start != self.num_nodes:
            raise DataError(f"{path}: {start} feature rows but num-node-list.csv.gz says {self.num_nodes} vertices")
