"""The :class:`Graph`: a validated, in-memory GNN dataset.

Edges are stored as an **in-edge CSR**: row ``v`` lists the sources ``u`` of the edges ``u -> v``,
because GCN's Gather sums over in-neighbours. Self loops and duplicate edges are removed on
construction (GCN normalisation adds its own self loop to every vertex), and the removal is logged.
Every constructor validates, so a ``Graph`` that exists is safe to train on.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass

import numpy as np

from dorylus_py.errors import DataError
from dorylus_py.settings import check_split

log = logging.getLogger(__name__)

SPLITS = ("train", "val", "test")
# A class is a column of every output layer and of the logits (N x C floats): 65,536 is 2 orders of magnitude
# above the largest single-label node-classification benchmarks (ogbn-papers100M 172, ogbn-mag 349 classes)
# and already 710 MB of logits on Cora's 2,708 vertices. A label or class count beyond it is a bad file.
MAX_CLASSES = 1 << 16
# The largest feature magnitude float32 training survives with room to spare. float32 ends at 3.4e38, so
# Adam's second moment (a gradient squared, the largest number training makes) overflows once a gradient
# passes 1.8e19. A first-layer activation or gradient is a feature times at most sqrt(degree) from the
# normalised adjacency's row sum (4.6e4 at 2^31 vertices) and sqrt(6F) from a Glorot-initialised product
# (2.5e3 at a million features): 1.2e8 in all. Features up to 1e9 keep that square below 1.4e34, 2.4e4
# under float32's end for the rest (widths of later layers, the classes). Measured on Cora (GCN, GAT, SAGE,
# 20 epochs, --feature-norm none): finite and the same accuracy up to 1e20, collapsing from 1e22.
MAX_FEATURE = 1e9


@dataclass(frozen=True, eq=False)
class Graph:
    indptr: np.ndarray  # (N + 1,) int64: in-edge CSR row pointers, row = destination
    indices: np.ndarray  # (E,) int64: source vertex of each in-edge, sorted within a row
    features: np.ndarray  # (N, F) float32
    labels: np.ndarray  # (N,) int64, -1 = unlabelled
    train_mask: np.ndarray  # (N,) bool
    val_mask: np.ndarray  # (N,) bool
    test_mask: np.ndarray  # (N,) bool
    num_classes: int
    source: str = "<memory>"  # where it came from, used in error messages

    @property
    def num_nodes(self) -> int:
        return len(self.indptr) - 1

    @property
    def num_edges(self) -> int:
        return len(self.indices)

    @property
    def num_features(self) -> int:
        return self.features.shape[1]

    def mask(self, split: str) -> np.ndarray:
        return {"train": self.train_mask, "val": self.val_mask, "test": self.test_mask}[split]

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(src, dst)`` int64 arrays, sorted by destination then source."""
        dst = np.repeat(np.arange(self.num_nodes, dtype=np.int64), np.diff(self.indptr))
        return self.indices.copy(), dst

    def in_degrees(self) -> np.ndarray:
        return np.diff(self.indptr)

    @classmethod
    def from_edges(
        cls,
        src,
        dst,
        features,
        labels,
        train_mask,
        val_mask,
        test_mask,
        *,
        num_nodes: int | None = None,
        num_classes: int | None = None,
        source: str = "<memory>",
    ) -> "Graph":
        """Build and validate a graph from directed edges ``src[i] -> dst[i]``.

        ``num_nodes`` defaults to the number of feature rows. Raises :class:`DataError` naming
        ``source`` and the problem on any inconsistency.
        """
        features = _as_features(features, source)
        n = features.shape[0] if num_nodes is None else int(num_nodes)
        if n < 1:
            raise DataError(f"{source}: the graph has no vertices")
        labels = _as_labels(labels, source)
        if len(labels) != n:
            raise DataError(f"{source}: {len(labels)} labels but the graph has {n} vertices (feature rows)")
        src = _as_ids(src, "source vertex ids", source)
        dst = _as_ids(dst, "destination vertex ids", source)
        if src.shape != dst.shape:
            raise DataError(f"{source}: {len(src)} source ids but {len(dst)} destination ids")
        for name, ids in (("source", src), ("destination", dst)):
            if len(ids) and (ids.min() < 0 or ids.max() >= n):
                bad = ids[(ids < 0) | (ids >= n)][0]
                raise DataError(f"{source}: {name} vertex id {bad} is out of range [0, {n})")
        indptr, indices = _coalesce_to_csr(src, dst, n, source)
        graph = cls(
            indptr=indptr,
            indices=indices,
            features=features,
            labels=labels,
            train_mask=_as_mask(train_mask, "train_mask", source),
            val_mask=_as_mask(val_mask, "val_mask", source),
            test_mask=_as_mask(test_mask, "test_mask", source),
            num_classes=-1 if num_classes is None else class_count(num_classes, source),
            source=source,
        )
        if num_classes is None:
            object.__setattr__(graph, "num_classes", _inferred_classes(graph.labels, source))
        graph.validate()
        return graph

    def validate(self) -> None:
        """Check every invariant; raise :class:`DataError` naming the first violation."""
        s, n = self.source, self.num_nodes
        if self.indptr[0] != 0 or self.indptr[-1] != len(self.indices) or np.any(np.diff(self.indptr) < 0):
            raise DataError(f"{s}: CSR row pointers are inconsistent")
        if len(self.indices) and (self.indices.min() < 0 or self.indices.max() >= n):
            raise DataError(f"{s}: CSR column index out of range [0, {n})")
        if self.features.ndim != 2 or self.features.shape[0] != n:
            raise DataError(f"{s}: features have {self.features.shape[0]} rows but the graph has {n} vertices")
        if self.features.shape[1] < 1:
            raise DataError(f"{s}: features have no columns")
        for start in range(0, n, 1 << 16):  # blockwise: no full-size temporaries
            check_features(self.features[start : start + (1 << 16)], s, start)
        validate_vertices(self.labels, (self.train_mask, self.val_mask, self.test_mask), self.num_classes, n, s)

    def summary(self) -> dict:
        deg = self.in_degrees()
        return {
            "nodes": self.num_nodes,
            "edges": self.num_edges,
            "features": self.num_features,
            "classes": self.num_classes,
            "train": int(self.train_mask.sum()),
            "val": int(self.val_mask.sum()),
            "test": int(self.test_mask.sum()),
            "unlabelled": int((self.labels < 0).sum()),
            "max_in_degree": int(deg.max()) if len(deg) else 0,
            "mean_in_degree": float(deg.mean()) if len(deg) else 0.0,
            "isolated": int((deg == 0).sum()),
        }


def validate_vertices(labels: np.ndarray, masks: tuple, num_classes: int, n: int, source: str) -> None:
    """Labels in range and masks of length ``n``, disjoint, labelled, with a non-empty train split."""
    if len(labels) != n:
        raise DataError(f"{source}: {len(labels)} labels but the graph has {n} vertices")
    if num_classes < 2:
        raise DataError(f"{source}: need at least 2 classes, found {num_classes}")
    if num_classes > MAX_CLASSES:
        raise DataError(f"{source}: {num_classes:,} classes, more than the {MAX_CLASSES:,} a model is trained for")
    bad = (labels < -1) | (labels >= num_classes)
    if bad.any():
        v = int(np.nonzero(bad)[0][0])
        raise DataError(
            f"{source}: label {labels[v]} of vertex {v} is out of range [0, {num_classes}) for "
            f"{num_classes} classes (-1 marks unlabelled): fix the label, or the class count if it is wrong"
        )
    for split, m in zip(SPLITS, masks):
        if m.shape != (n,):
            raise DataError(f"{source}: {split}_mask has {len(m)} entries but the graph has {n} vertices")
        unlabelled = m & (labels < 0)
        if unlabelled.any():
            v = int(np.nonzero(unlabelled)[0][0])
            raise DataError(f"{source}: vertex {v} is in the {split} split but has no label (-1)")
    for (a, ma), (b, mb) in itertools.combinations(zip(SPLITS, masks), 2):
        both = ma & mb
        if both.any():
            raise DataError(
                f"{source}: {a} and {b} masks overlap ({int(both.sum())} vertices, first {int(np.argmax(both))})"
            )
    if not masks[0].any():
        raise DataError(f"{source}: the train split is empty")


def random_split(
    labels: np.ndarray, train_frac: float, val_frac: float, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded random split of the labelled vertices; the rest of them are the test split."""
    check_split(train_frac, val_frac, seed)
    labelled = np.nonzero(labels >= 0)[0]
    order = np.random.default_rng(seed).permutation(labelled)
    n_train = max(1, int(round(train_frac * len(order))))
    n_val = int(round(val_frac * len(order)))
    masks = [np.zeros(len(labels), dtype=bool) for _ in SPLITS]
    masks[0][order[:n_train]] = True
    masks[1][order[n_train : n_train + n_val]] = True
    masks[2][order[n_train + n_val :]] = True
    return masks[0], masks[1], masks[2]


def row_normalized(x: np.ndarray) -> np.ndarray:
    """Scale each row to sum 1 (rows that sum to 0 stay 0): GCN practice for bag-of-words features."""
    sums = x.sum(axis=1, keepdims=True, dtype=np.float64)
    sums[sums == 0] = 1.0
    return (x / sums).astype(np.float32)


def check_features(x: np.ndarray, source: str, first_row: int = 0) -> None:
    """Every feature of the rows ``x`` (vertices ``first_row`` on) is finite and within ``MAX_FEATURE``: one
    vectorised pass, so the streamed blocks of ``prepare`` and a whole graph are checked alike."""
    ok = np.abs(x) <= MAX_FEATURE  # NaN compares False
    if ok.all():
        return
    row = int(np.flatnonzero(~ok.all(axis=1))[0])
    value = x[row][~ok[row]][0]
    if not np.isfinite(value):
        raise DataError(f"{source}: features contain NaN or infinity (first at vertex {first_row + row})")
    raise DataError(f"{source}: feature {value:.3g} of vertex {first_row + row} is beyond ±{MAX_FEATURE:,.0f}, more "
                    "than float32 training survives (squared gradients overflow); scale or standardise the features")


def class_count(value, source: str) -> int:
    """A class count that came with the data (an npz's ``num_classes``) as an int: one finite integer."""
    a = np.asarray(value)
    if a.size != 1 or a.ndim > 1:
        raise DataError(f"{source}: num_classes must be one integer, got an array of shape {a.shape}")
    if not (np.issubdtype(a.dtype, np.integer) or np.issubdtype(a.dtype, np.floating)):
        raise DataError(f"{source}: num_classes must be one integer, got an array of dtype {a.dtype}")
    v = a.reshape(()).item()
    if not np.isfinite(v) or v != int(v):
        raise DataError(f"{source}: num_classes must be an integer, got {v}")
    return int(v)


def _as_features(x, source: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise DataError(f"{source}: features must be a 2-D array (vertices x features), got shape {x.shape}")
    if not (np.issubdtype(x.dtype, np.floating) or np.issubdtype(x.dtype, np.integer) or x.dtype == bool):
        raise DataError(f"{source}: features must be numeric, got dtype {x.dtype}")
    return np.ascontiguousarray(x, dtype=np.float32)


def _as_ids(x, what: str, source: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise DataError(f"{source}: {what} must be a 1-D array, got shape {x.shape}")
    if len(x) and not np.issubdtype(x.dtype, np.integer):
        raise DataError(f"{source}: {what} must be integers, got dtype {x.dtype}")
    return x.astype(np.int64, copy=False)


def _inferred_classes(labels: np.ndarray, source: str) -> int:
    """The class count of labels given without one: every class in ``[0, max]`` must have a vertex, or a
    stray label (99 among 0..6) would silently make 100 classes, 93 of them empty."""
    if len(labels) and labels.max() >= MAX_CLASSES:  # before any array of that size
        v = int(np.argmax(labels >= MAX_CLASSES))
        raise DataError(f"{source}: label {labels[v]} of vertex {v} is beyond the {MAX_CLASSES:,} classes a model is "
                        "trained for")
    used = np.unique(labels[labels >= 0])
    if len(used) and len(used) != used[-1] + 1:
        missing = np.setdiff1d(np.arange(used[-1] + 1), used)
        raise DataError(
            f"{source}: labels reach {used[-1]} but classes {_ranges(missing)} have no vertex; renumber the labels "
            f"to 0..{len(used) - 1} (np.unique(labels, return_inverse=True)), mark stray ones -1, or give the class "
            "count (num_classes) if empty classes are meant"
        )
    return int(used[-1]) + 1 if len(used) else 0


def _ranges(ids: np.ndarray, shown: int = 3) -> str:
    """``7..98`` or ``2, 5, 9..12`` (the first few runs) for sorted ids."""
    runs = np.split(ids, np.nonzero(np.diff(ids) != 1)[0] + 1)
    text = [f"{r[0]}..{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in runs[:shown]]
    return ", ".join(text) + (", ..." if len(runs) > shown else "")


def _as_labels(x, source: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise DataError(f"{source}: labels must be a 1-D array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.integer):
        if np.issubdtype(x.dtype, np.floating) and np.all(np.isfinite(x)) and np.all(x == np.round(x)):
            return x.astype(np.int64)
        raise DataError(f"{source}: labels must be integers, got dtype {x.dtype}")
    return x.astype(np.int64, copy=False)


def _as_mask(x, name: str, source: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 1:
        raise DataError(f"{source}: {name} must be a 1-D array, got shape {x.shape}")
    if x.dtype != bool:
        if not np.isin(x, (0, 1)).all():
            raise DataError(f"{source}: {name} must be boolean (0/1), got other values")
        x = x.astype(bool)
    return x


def _coalesce_to_csr(src: np.ndarray, dst: np.ndarray, n: int, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Sort edges by (dst, src), drop self loops and duplicates, return in-edge CSR."""
    loops = src == dst
    n_loops = int(loops.sum())
    if n_loops:
        src, dst = src[~loops], dst[~loops]
    key = dst * n + src  # n <= 2**31 keeps this inside int64
    key = np.unique(key)  # sorts, and removes duplicates
    n_dups = len(src) - len(key)
    if n_loops or n_dups:
        log.warning(
            "%s: dropped %d self loops and %d duplicate edges (GCN normalisation adds one self loop per vertex)",
            source,
            n_loops,
            n_dups,
        )
    dst_sorted = key // n
    indices = key - dst_sorted * n
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst_sorted, minlength=n), out=indptr[1:])
    return indptr, indices
