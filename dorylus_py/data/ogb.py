"""An OGB node-property dataset folder, as the ``ogb`` package saves it: ``ogbn_arxiv/`` for the dataset
ogbn-arxiv (its name with ``_`` for ``-``), ``ogbn_products/``, in either layout OGB ships. The csv layout:

- ``raw/edge.csv.gz``: one ``src,dst`` pair per line (no header); every edge is read in both directions
  (as OGB's loader does for ogbn-products, and its examples for ogbn-arxiv: GCN aggregates in-edges);
- ``raw/node-feat.csv.gz``: one row of F comma-separated floats per vertex;
- ``raw/node-label.csv.gz``: one integer class per vertex (``nan`` or empty: unlabelled);
- ``raw/num-node-list.csv.gz``: the vertex count (``raw/num-edge-list.csv.gz``: the edge count, optional);
- ``split/<name>/{train,valid,test}.csv.gz``: the vertex ids of each split, the split used.

The binary layout (``ogbn_papers100M/``, :class:`OgbBinaryFolder`) has ``raw/data.npz`` and
``raw/node-label.npz`` instead of the ``raw`` csv files, and the same split.

The csv files are read in bounded blocks of lines (:func:`csv_blocks`, ``data/textblocks.py``), never
whole: what ``prepare`` streams costs memory per vertex, not per edge, whatever a file holds. Every block is
checked as it is parsed, so a ragged or overlong line, a non-number or an id out of range is one line
naming the file and the line; counts are checked against what the files can hold before they are used.
The binary layout's arrays are read through ``data/npystream.py`` alike: each header checked against its
size in the zip before anything is sized by it, the edges streamed a block at a time.
"""

from __future__ import annotations

import gzip
import itertools
import os
import zlib
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path
from typing import Iterator

import numpy as np

from dorylus_py.data.graph import MAX_CLASSES, check_features
from dorylus_py.data.npystream import NpyMember, npz_members
from dorylus_py.data.textblocks import MAX_LINE_BYTES, gzip_capacity, line_blocks, parse_csv, too_long
from dorylus_py.errors import DataError

SPLIT_FILES = ("train", "valid", "test")  # OGB's names for train, val, test
MAX_NODES = 2**31 - 1  # vertex ids are int32 in a prepared store
MAX_EDGES = 2**36  # as `dorylus synth --edges`: about 1 TB of edge buckets on disk


def is_ogb_folder(path: str | Path) -> bool:
    """``path`` is an OGB dataset folder, in the csv layout (``raw/edge.csv.gz``) or the binary one
    (``raw/data.npz``)."""
    raw = Path(path) / "raw"
    return (raw / "edge.csv.gz").exists() or (raw / "data.npz").exists()


def open_ogb(path: str | Path) -> "OgbFolder | OgbBinaryFolder":
    """The reader of an OGB folder's layout: csv where ``raw/edge.csv.gz`` is, else binary."""
    return OgbFolder(path) if (Path(path) / "raw" / "edge.csv.gz").exists() else OgbBinaryFolder(path)


def ogb_hint(path: Path) -> str | None:
    """What to give instead of ``path``, a folder that is no dataset, when OGB datasets are near it: the
    dataset folders under a root such as the ``ogb`` package's ``dataset/`` (``ogbn_arxiv``, ...), or the
    dataset a ``raw/`` folder belongs to. None if there are none."""
    if path.name == "raw" and is_ogb_folder(path.parent):
        return f"the raw/ folder of an OGB dataset; give the dataset folder, {path.parent}"
    try:
        with os.scandir(path) as entries:  # a root holds a few datasets, not a million entries
            found = [e.name for e in itertools.islice(entries, 10_000) if e.is_dir() and is_ogb_folder(e.path)]
    except OSError:
        return None
    if not found:
        return None
    names = ", ".join(str(path / name) for name in sorted(found)[:5]) + (", ..." if len(found) > 5 else "")
    return f"a folder of OGB datasets, not one; give one of them: {names}"


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


SINGLE_LABEL = "only single-label classification is trained (not multi-label tasks such as ogbn-proteins)"


def checked_labels(y: np.ndarray, at) -> np.ndarray:
    """(N,) float labels (``nan``: unlabelled) as int64 classes, -1 = unlabelled; each a whole class in
    ``[0, MAX_CLASSES)``. ``at(v)``: where vertex v's label is, for the error line."""
    known = ~np.isnan(y)
    if (y[known] != np.round(y[known])).any():
        v = int(np.flatnonzero(known & (y != np.round(y)))[0])
        raise DataError(f"{at(v)}: label {y[v]} is not an integer class")
    negative = np.flatnonzero(known & (y < 0))
    if len(negative):  # -1 would read as unlabelled: refuse it here, where it is still a label
        v = int(negative[0])
        raise DataError(f"{at(v)}: label {y[v]:.15g} of vertex {v} is out of range (classes count from 0)")
    beyond = np.flatnonzero(known & (y >= MAX_CLASSES))
    if len(beyond):  # before the cast: 1e30 is no int64
        v = int(beyond[0])
        raise DataError(f"{at(v)}: label {y[v]:.15g} of vertex {v} is beyond the {MAX_CLASSES:,} classes a model is "
                        "trained for")
    return np.where(known, y, -1).astype(np.int64)


def split_masks(folder: Path, num_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Train, val, test (N,) bool from the one split an OGB folder ships, ``split/<name>/``."""
    root = folder / "split"
    names = sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    if len(names) != 1:
        raise DataError(f"{root}: {'no split folder' if not names else 'several splits (' + ', '.join(names) + ')'}"
                        "; an OGB dataset folder ships one, split/<name>/{train,valid,test}.csv.gz")
    masks = []
    for name in SPLIT_FILES:
        path = root / names[0] / f"{name}.csv.gz"
        if not path.exists():
            pickled = " (split_dict.pt, a pickle, is not read: it could run code)" if (
                root / names[0] / "split_dict.pt").exists() else ""
            raise DataError(f"{path}: missing (a split needs train, valid and test){pickled}")
        ids = read_column(path, np.int64, num_nodes, f"a split of {num_nodes} vertices")
        if len(ids) and (ids.min() < 0 or ids.max() >= num_nodes):
            bad = ids[(ids < 0) | (ids >= num_nodes)][0]
            raise DataError(f"{path}: vertex id {bad} is out of range [0, {num_nodes})")
        mask = np.zeros(num_nodes, dtype=bool)
        mask[ids] = True
        masks.append(mask)
    return masks[0], masks[1], masks[2]


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
            raise DataError(f"{path}: {first_line_width(path)} labels per vertex; {SINGLE_LABEL}")
        y = read_column(path, np.float64, self.num_nodes, f"num-node-list.csv.gz says {self.num_nodes} vertices")
        if len(y) != self.num_nodes:
            raise DataError(f"{path}: {len(y)} labels but num-node-list.csv.gz says {self.num_nodes} vertices")
        return checked_labels(y, lambda v: f"{path}:{v + 1}")

    def masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return split_masks(self.path, self.num_nodes)

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


DATA_ARRAYS = ("edge_index", "node_feat", "num_nodes_list", "num_edges_list")  # of raw/data.npz; node_year ...: unread


class OgbBinaryFolder:
    """OGB's binary layout of a node-property dataset, as ogbn-papers100M ships: ``raw/data.npz`` holding
    ``edge_index`` (2, E) ints (each edge read in both directions, as the csv layout's), ``node_feat`` (N, F),
    ``num_nodes_list`` and ``num_edges_list`` (one graph: one count each; other ``node_*`` arrays such as
    ``node_year`` are read past), ``raw/node-label.npz`` holding ``node_label`` (N,) or (N, 1) (``nan``:
    unlabelled), and the split of the csv layout. Every array's header is checked against its size in the zip
    before anything is sized by it (``npz_members``), and the counts against the shapes: N rows of features
    of at least one column, as many edges as ``num_edges_list`` says."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.data = self.path / "raw" / "data.npz"
        arrays = npz_members(_regular(self.data), DATA_ARRAYS)
        missing = [name for name in DATA_ARRAYS if name not in arrays]
        if missing:
            raise DataError(f"{self.data}: no {', '.join(missing)} (OGB's data.npz holds {', '.join(DATA_ARRAYS)})")
        self.num_nodes = _one_count(arrays["num_nodes_list"], "vertices", MAX_NODES)
        if self.num_nodes < 1:
            raise DataError(f"{self.data}: num_nodes_list: the graph has no vertices")
        self._features, self._edges = arrays["node_feat"], arrays["edge_index"]
        shape, dtype = self._features.shape, self._features.dtype
        if len(shape) != 2 or shape[0] != self.num_nodes or shape[1] < 1 or not _numeric(dtype):
            raise DataError(f"{self.data}: node_feat is {dtype} of shape {shape}; num_nodes_list says "
                            f"{self.num_nodes:,} vertices, so it must be numbers of shape ({self.num_nodes}, features)")
        self.num_features = shape[1]
        shape, dtype = self._edges.shape, self._edges.dtype
        if len(shape) != 2 or shape[0] != 2 or not np.issubdtype(dtype, np.integer):
            raise DataError(f"{self.data}: edge_index is {dtype} of shape {shape}, not integers of shape (2, edges)")
        edges = _one_count(arrays["num_edges_list"], "edges", MAX_EDGES)
        if edges != shape[1]:
            raise DataError(f"{self.data}: num_edges_list says {edges:,} edges, but edge_index holds {shape[1]:,}")

    @property
    def source(self) -> str:
        return str(self.path)

    def labels(self) -> np.ndarray:
        """(N,) int64, -1 = unlabelled."""
        path = self.path / "raw" / "node-label.npz"
        member = npz_members(_regular(path), ("node_label",)).get("node_label")
        if member is None:
            raise DataError(f"{path}: no node_label array")
        shape = member.shape
        if len(shape) == 2 and shape[1] != 1:
            raise DataError(f"{path}: node_label has {shape[1]} labels per vertex; {SINGLE_LABEL}")
        if not 1 <= len(shape) <= 2 or shape[0] != self.num_nodes or not _numeric(member.dtype):
            raise DataError(f"{path}: node_label is {member.dtype} of shape {shape}; num_nodes_list says "
                            f"{self.num_nodes:,} vertices, so it must be numbers of shape ({self.num_nodes}, 1)")
        return checked_labels(member.read().reshape(-1).astype(np.float64), lambda v: f"{path}:node_label[{v}]")

    def masks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return split_masks(self.path, self.num_nodes)

    def num_edge_records(self) -> int:
        """Directed edges as read (each stored edge twice)."""
        return 2 * self._edges.shape[1]

    def edge_blocks(self, size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(src, dst)`` int64 blocks, every edge in both directions, ids checked in range: ``edge_index``'s two
        rows read side by side, ``size`` edges at a time (two streams of the member; neither is held whole)."""
        n, first = self.num_nodes, 0
        for src, dst in zip(self._edges.row_blocks(0, size), self._edges.row_blocks(1, size)):
            src, dst = src.astype(np.int64), dst.astype(np.int64)
            bad = np.flatnonzero((src < 0) | (src >= n) | (dst < 0) | (dst >= n))
            if len(bad):
                i = int(bad[0])
                v = src[i] if not 0 <= src[i] < n else dst[i]
                raise DataError(f"{self.data}: edge_index: edge {first + i:,} has vertex id {v}, out of range "
                                f"[0, {n}) set by num_nodes_list")
            first += len(src)
            yield np.concatenate([src, dst]), np.concatenate([dst, src])

    def feature_blocks(self, size: int) -> Iterator[np.ndarray]:
        """float32 ``(rows, F)`` blocks, finite and within float32 training's range (checked before the cast)."""
        start = 0
        for block in self._features.blocks(size):
            check_features(block, f"{self.data}: node_feat", start)
            start += len(block)
            yield block.astype(np.float32)


def _regular(path: Path) -> Path:
    """``path``, if a regular file (a FIFO would hang the read); else one line."""
    if not path.exists():
        raise DataError(f"{path}: missing (an OGB dataset folder in the binary layout has raw/data.npz and "
                        "raw/node-label.npz)")
    if not path.is_file():
        raise DataError(f"{path}: not a regular file")
    return path


def _one_count(member: NpyMember, what: str, most: int) -> int:
    """The one count of ``num_nodes_list`` or ``num_edges_list``, within ``[0, most]``."""
    if member.shape not in ((1,), (1, 1)) or not np.issubdtype(member.dtype, np.integer):
        several = len(member.shape) == 1 and member.shape[0] > 1
        raise DataError(f"{member.where}: {member.dtype} of shape {member.shape}, not one integer" + (
            " (several graphs: only single-graph node-property datasets are read)" if several else ""))
    count = int(member.read().reshape(-1)[0])
    if not 0 <= count <= most:
        raise DataError(f"{member.where}: {count:,} {what}, out of range [0, {most:,}]")
    return count


def _numeric(dtype: np.dtype) -> bool:
    return np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.floating)
