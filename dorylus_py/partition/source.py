"""What ``prepare`` reads: a graph's counts and per-vertex arrays, and its edges and features in blocks.

An ``.npz`` is streamed (``data/npystream.py``): edges and features are never loaded whole, so a
graph larger than memory can be prepared. Every other format is loaded as a :class:`Graph` first
and then read in the same blocks. Both check what :class:`Graph` checks (ids in range, finite
features, labels and masks consistent), naming the file and the problem.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from dorylus_py.data.formats import NPZ_ARRAYS, Sources, load_graph, masks_from
from dorylus_py.data.graph import (
    Graph,
    _as_labels,
    _as_mask,
    _inferred_classes,
    check_features,
    class_count,
    validate_vertices,
)
from dorylus_py.data.npystream import npz_members
from dorylus_py.data.ogb import is_ogb_folder, open_ogb
from dorylus_py.datasets import resolve
from dorylus_py.errors import DataError

EdgeBlocks = Iterator[tuple[np.ndarray, np.ndarray]]  # (src, dst) int64, checked in range


@dataclass(frozen=True, eq=False)
class GraphSource:
    name: str  # file, for messages and the manifest
    num_nodes: int
    num_features: int
    num_classes: int
    num_edge_records: int  # edges as given: self loops and duplicates not yet dropped
    labels: np.ndarray  # (N,) int64, -1 = unlabelled
    masks: tuple[np.ndarray, np.ndarray, np.ndarray]  # train, val, test (N,) bool
    edge_blocks: Callable[[int], EdgeBlocks]  # edges per block -> (src, dst) blocks
    feature_blocks: Callable[[int], Iterator[np.ndarray]]  # rows per block -> float32 (rows, F), finite

    def summary_counts(self) -> dict:
        return {"train": int(self.masks[0].sum()), "val": int(self.masks[1].sum()), "test": int(self.masks[2].sum()),
                "unlabelled": int((self.labels < 0).sum())}


def open_source(path: str | os.PathLike, sources: Sources = Sources()) -> GraphSource:
    """Stream ``path`` if it is an ``.npz``; load any other dataset whole (see ``data/formats.py``); a bundled
    reference graph by name (``datasets``)."""
    path = resolve(path)
    p = Path(str(path))
    if p.suffix == ".npz" and p.is_file():
        return npz_source(p, sources)
    if p.is_dir() and is_ogb_folder(p) and sources.masks is None:
        return ogb_source(p)
    return graph_source(load_graph(path, sources))


def ogb_source(path: Path) -> GraphSource:
    """An OGB node-property dataset folder (``data/ogb.py``, either layout), its edges and features streamed."""
    folder = open_ogb(path)
    labels, masks = folder.labels(), folder.masks()
    classes = _inferred_classes(labels, str(path))
    validate_vertices(labels, masks, classes, folder.num_nodes, str(path))
    return GraphSource(str(path), folder.num_nodes, folder.num_features, classes, folder.num_edge_records(), labels,
                       masks, folder.edge_blocks, folder.feature_blocks)


def graph_source(graph: Graph) -> GraphSource:
    """A :class:`Graph` in memory, read as a source (its edges by destination blocks)."""

    def edge_blocks(size: int) -> EdgeBlocks:
        for start in range(0, graph.num_edges, size):
            stop = min(start + size, graph.num_edges)
            rows = np.searchsorted(graph.indptr, np.arange(start, stop), side="right") - 1
            yield graph.indices[start:stop].astype(np.int64), rows

    def feature_blocks(size: int):
        for start in range(0, graph.num_nodes, size):
            yield graph.features[start : start + size]

    return GraphSource(graph.source, graph.num_nodes, graph.num_features, graph.num_classes, graph.num_edges,
                       graph.labels, (graph.train_mask, graph.val_mask, graph.test_mask), edge_blocks, feature_blocks)


def npz_source(path: Path, sources: Sources = Sources()) -> GraphSource:
    """An ``.npz`` of ``src``, ``dst``, ``features``, ``labels`` [+ masks, ``num_classes``], streamed."""
    arrays = npz_members(path, NPZ_ARRAYS)
    missing = [k for k in ("src", "dst", "features", "labels") if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing array(s) {', '.join(missing)} (expected src, dst, features, labels)")
    src, dst, feats = arrays["src"], arrays["dst"], arrays["features"]
    if len(feats.shape) != 2:
        raise DataError(f"{path}: features must be a 2-D array (vertices x features), got shape {feats.shape}")
    if not (np.issubdtype(feats.dtype, np.number) or feats.dtype == bool):
        raise DataError(f"{path}: features must be numeric, got dtype {feats.dtype}")
    n, f = feats.shape
    if n < 1:
        raise DataError(f"{path}: the graph has no vertices")
    if f < 1:
        raise DataError(f"{path}: features have no columns")
    for name, a in (("source vertex ids", src), ("destination vertex ids", dst)):
        if len(a.shape) != 1:
            raise DataError(f"{path}: {name} must be a 1-D array, got shape {a.shape}")
        if len(a) and not np.issubdtype(a.dtype, np.integer):
            raise DataError(f"{path}: {name} must be integers, got dtype {a.dtype}")
    if len(src) != len(dst):
        raise DataError(f"{path}: {len(src)} source ids but {len(dst)} destination ids")
    for name in ("labels", "train_mask", "val_mask", "test_mask"):  # per-vertex: n of them, before any is read
        shape = arrays[name].shape if name in arrays else (n,)
        if len(shape) != 1:
            raise DataError(f"{path}: {name} must be a 1-D array, got shape {shape}")
        if shape[0] != n:
            count = f"{shape[0]} labels" if name == "labels" else f"{name} has {shape[0]} entries"
            raise DataError(f"{path}: {count} but the graph has {n} vertices (feature rows)")
    labels = _as_labels(arrays["labels"].read(), str(path))
    small = {k: arrays[k].read() for k in ("train_mask", "val_mask", "test_mask") if k in arrays}
    masks = tuple(_as_mask(m, name, str(path)) for m, name in
                  zip(masks_from(small, path, labels, sources), ("train_mask", "val_mask", "test_mask")))
    classes = (npz_class_count(arrays["num_classes"], path) if "num_classes" in arrays
               else _inferred_classes(labels, str(path)))
    validate_vertices(labels, masks, classes, n, str(path))

    def edge_blocks(size: int) -> EdgeBlocks:
        for s, d in zip(src.blocks(size), dst.blocks(size)):
            yield check_ids(s, n, "source", path), check_ids(d, n, "destination", path)

    def feature_blocks(size: int):
        start = 0
        for block in feats.blocks(size):
            x = np.asarray(block, dtype=np.float32)
            check_features(x, str(path), start)
            start += len(x)
            yield x

    return GraphSource(str(path), n, f, classes, len(src), labels, masks, edge_blocks, feature_blocks)


def npz_class_count(member, path) -> int:
    """An npz's ``num_classes``: one number (its header says so before it is read), an integer."""
    if int(np.prod(member.shape, dtype=np.float64)) != 1:
        raise DataError(f"{path}: num_classes must be one integer, got an array of shape {member.shape}")
    return class_count(member.read(), str(path))


def check_ids(ids: np.ndarray, n: int, what: str, path) -> np.ndarray:
    ids = ids.astype(np.int64, copy=False)
    if len(ids) and (ids.min() < 0 or ids.max() >= n):
        bad = ids[(ids < 0) | (ids >= n)][0]
        raise DataError(f"{path}: {what} vertex id {bad} is out of range [0, {n})")
    return ids
