"""An OGB node-property dataset folder, as the ``ogb`` package saves it (``ogbn-arxiv``, ``ogbn-products``):

- ``raw/edge.csv.gz``: one ``src,dst`` pair per line (no header); every edge is read in both directions
  (as OGB's loader does for ogbn-products, and its examples for ogbn-arxiv: GCN aggregates in-edges);
- ``raw/node-feat.csv.gz``: one row of F comma-separated floats per vertex;
- ``raw/node-label.csv.gz``: one integer class per vertex (``nan`` or empty: unlabelled);
- ``raw/num-node-list.csv.gz``: the vertex count (``raw/num-edge-list.csv.gz``: the edge count, optional);
- ``split/<name>/{train,valid,test}.csv.gz``: the vertex ids of each split, the split used.

The csv files are read in bounded blocks of lines (:func:`csv_blocks`, ``data/textblocks.py``), never
whole: what ``prepare`` streams costs memory per vertex, not per edge, whatever a file holds. Every block is
checked as it is parsed, so a ragged or overlong line, a non-number or an id out of range is one line
naming the file and the line; counts are checked against what the files can hold before they are used.
"""

from __future__ import annotations

import gzip
import zlib
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np

from dorylus_py.data.graph import MAX_CLASSES, check_features
from dorylus_py.data.textblocks import MAX_LINE_BYTES, gzip_capacity, line_blocks, parse_csv, too_long
from dorylus_py.errors import DataError

SPLIT_FILES = ("train", "valid", "test")  # OGB's names for train, val, test
MAX_NODES = 2**31 - 1  # vertex ids are int32 in a prepared store
MAX_EDGES = 2**36  # as `dorylus synth --edges`: about 1 TB of edge buckets on disk


def is_ogb_folder(path: str | Path) -> bool:
    """``path`` is a folder in the OGB layout (it has ``raw/edge.csv.gz``)."""
    return (Path(path) / "raw" / "edge.csv.gz").is_file()


def csv_blocks(path: Path, columns: int, dtype, block_bytes: int | None = None, max_rows: int | None = None,
               why: str = "") -> Iterator[np.ndarray]:
    """The rows of a gzipped numeric csv of ``columns`` values per line, as ``(rows, columns)`` arrays of
    ``dtype`` (float: ``nan`` and empty fields allowed), a bounded block of lines at a time
    (``data/textblocks.py``); more than ``max_rows`` rows is a DataError (``why`` says why) as soon as read."""
    rows = 0
    with _opened(path) as f:
        for line, text in line_blocks(f, path, block_bytes):
            if text.strip() or b"\n" in text:  # not the blanks after the last newline
                block = parse_csv(text, columns, dtype, path, line)
                rows += len(block)
                if max_rows is not None and rows > max_rows:
                    raise DataError(f"{path}: more than {max_rows:,} rows ({why or 'the most it may hold'})")
                yield block


@contextmanager
def _opened(path: Path):
    """``path`` as a gzip stream; a missing or unreadable file, or one that ends early, is one line."""
    if path.exists() and not path.is_file():  # a FIFO would hang the read
        raise DataError(f"{path}: not a regular file")
    try:
        with gzip.open(path, "rb") as f:
            yield f
    except FileNotFoundError:
        raise DataError(f"{path}: missing (an OGB dataset folder has it)") from None
    except (OSError, EOFError, zlib.error) as e:
        raise DataError(f"{path}: not a readable .csv.gz ({str(e).strip() or type(e).__name__})") from None


def first_line_width(path: Path) -> int:
    """The number of comma-separated values on the first line of a gzipped csv."""
    with _opened(path) as f:
        first = f.readline(MAX_LINE_BYTES + 2)
    if len(first.rstrip(b"\n")) > MAX_LINE_BYTES:
        raise too_long(path, 1, MAX_LINE_BYTES)
    if not first.strip():
        raise DataError(f"{path}: empty")
    return first.count(b",") + 1


def read_column(path: Path, dtype, max_rows: int, why: str) -> np.ndarray:
    """A one-column csv, whole (``(N,)``): labels, split ids, counts; at most ``max_rows`` rows."""
    blocks = [b[:, 0] for b in csv_blocks(path, 1, dtype, max_rows=max_rows, why=why)]
    return np.concatenate(blocks) if blocks else np.zeros(0, dtype)


def read_count(path: Path, what: str, most: int) -> int:
    """The one count in ``path`` (``num-node-list.csv.gz``), within ``[0, most]``."""
    counts = read_column(path, np.int64, 1, "one graph: only single-graph node-property datasets are read")
    if len(counts) != 1:
        raise DataError(f"{path}: empty (it holds the number of {what})")
    if not 0 <= counts[0] <= most:
        raise DataError(f"{path}: {counts[0]:,} {what}, out of range [0, {most:,}]")
    return int(counts[0])


class OgbFolder:
    """An OGB node-property dataset folder: its counts and per-vertex arrays read at once, its edges and
    features in blocks. Every count a file states is checked against what the files can hold before
    anything of that size is made, and against what they do hold as they are read."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        raw = self.path / "raw"
        self.num_nodes = read_count(raw / "num-node-list.csv.gz", "vertices", MAX_NODES)
        if self.num_nodes < 1:
            raise DataError(f"{raw / 'num-node-list.csv.gz'}: the graph has no vertices")
        self.num_features = first_line_width(raw / "node-feat.csv.gz")
        _check_fits(raw / "num-node-list.csv.gz", self.num_nodes, "vertices", raw / "node-feat.csv.gz",
                    2 * self.num_features)  # a row is F numbers and their commas

    @property
    def source(self) -> str:
        return str(self.path)

    def labels(self) -> np.ndarray:
        """(N,) int64, -1 = unlabelled."""
        path = self.path / "raw" / "node-label.csv.gz"
        if path.exists() and first_line_width(path) != 1:
            raise DataError(f"{path}: {first_line_width(path)} labels per vertex; only single-label classification "
                            "is trained (not multi-label tasks such as ogbn-proteins)")
        y = read_column(path, np.float64, self.num_nodes, f"num-node-list.csv.gz says {self.num_nodes} vertices")
        if len(y) != self.num_nodes:
            raise DataError(f"{path}: {len(y)} labels but num-node-list.csv.gz says {self.num_nodes} vertices")
        known = ~np.isnan(y)
        if (y[known] != np.round(y[known])).any():
            v = int(np.flatnonzero(known & (y != np.round(y)))[0])
            raise DataError(f"{path}:{v + 1}: label {y[v]} is not an integer class")
        negative = np.flatnonzero(known & (y < 0))
        if len(negative):  # -1 would read as unlabelled: refuse it here, where it is still a label
            v = int(negative[0])
            raise DataError(f"{path}:{v + 1}: label {y[v]:.15g} of vertex {v} is out of range (classes count from 0)")
        beyond = np.flatnonzero(known & (y >= MAX_CLASSES))
        if len(beyond):  # before the cast: 1e30 is no int64
            v = int(beyond[0])
            raise DataError(f"{path}:{v + 1}: label {y[v]:.15g} of vertex {v} is beyond the {MAX_CLASSES:,} classes "
                            "a model is trained for")
        return np.where(known, y, -1).astype(np.int64)

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
            ids = read_column(path, np.int64, self.num_nodes, f"a split of {self.num_nodes} vertices")
            if len(ids) and (ids.min() < 0 or ids.max() >= self.num_nodes):
                bad = ids[(ids < 0) | (ids >= self.num_nodes)][0]
                raise DataError(f"{path}: vertex id {bad} is out of range [0, {self.num_nodes})")
            mask = np.zeros(self.num_nodes, dtype=bool)
            mask[ids] = True
            masks.append(mask)
        return masks[0], masks[1], masks[2]

    def num_edge_records(self) -> int:
        """Directed edges as read (each file edge twice): from num-edge-list.csv.gz, else by counting lines."""
        declared = self.declared_edges
        if declared is not None:
            return 2 * declared
        return 2 * sum(len(b) for b in csv_blocks(self.path / "raw" / "edge.csv.gz", 2, np.int64))

    @cached_property
    def declared_edges(self) -> int | None:
        """The edge count of num-edge-list.csv.gz (None without one), within what edge.csv.gz can hold."""
        path = self.path / "raw" / "num-edge-list.csv.gz"
        if not path.exists():
            return None
        edges = read_count(path, "edges", MAX_EDGES)
        _check_fits(path, edges, "edges", self.path / "raw" / "edge.csv.gz", 4)  # "0,1\n"
        return edges

    def edge_blocks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(src, dst)`` int64 blocks, every edge in both directions, ids checked in range, as many edges
        as num-edge-list.csv.gz says."""
        path, n, line = self.path / "raw" / "edge.csv.gz", self.num_nodes, 1
        declared = self.declared_edges
        for block in csv_blocks(path, 2, np.int64, block_bytes=max(1 << 16, 16 * size), max_rows=declared,
                            why=f"num-edge-list.csv.gz says {declared} edges"):
            bad = np.flatnonzero(((block < 0) | (block >= n)).any(axis=1))
            if len(bad):
                i = int(bad[0])
                raise DataError(f"{path}:{line + i}: vertex id {block[i].max() if block[i].max() >= n else block[i].min()}"
                                f" is out of range [0, {n}) set by num-node-list.csv.gz")
            line += len(block)
            yield np.concatenate([block[:, 0], block[:, 1]]), np.concatenate([block[:, 1], block[:, 0]])
        if declared is not None and line - 1 != declared:
            raise DataError(f"{path}: {line - 1} edges but num-edge-list.csv.gz says {declared}")

    def feature_blocks(self, size: int) -> Iterator[np.ndarray]:
        """float32 ``(rows, F)`` blocks, finite and within float32 training's range, ``N`` rows in all."""
        path, start = self.path / "raw" / "node-feat.csv.gz", 0
        f = self.num_features
        for block in csv_blocks(path, f, np.float32, block_bytes=max(1 << 16, 16 * size * f), max_rows=self.num_nodes,
                                why=f"num-node-list.csv.gz says {self.num_nodes} vertices"):
            check_features(block, str(path), start)
            start += len(block)
            yield block
        if start != self.num_nodes:
            raise DataError(f"{path}: {start} feature rows but num-node-list.csv.gz says {self.num_nodes} vertices")


def _check_fits(count_file: Path, count: int, what: str, data: Path, row_bytes: int) -> None:
    """``count`` rows of at least ``row_bytes`` bytes fit in the gzip ``data`` (else it is a lie, refused
    before any array of that count is made)."""
    if not data.is_file():
        return  # its reader says so
    with _opened(data) as f:
        f.read(1)  # a gzip at all (else its reader's line, not a count's)
    if count > gzip_capacity(data, row_bytes):
        raise DataError(f"{count_file}: {count:,} {what}, more than {data.name} ({data.stat().st_size:,} bytes) "
                        "can hold")
