"""Read and write graphs in the formats users bring.

- ``.npz``: arrays ``src``, ``dst``, ``features``, ``labels`` and optionally ``train_mask``,
  ``val_mask``, ``test_mask`` (the layout of the reference datasets; ``dorylus synth`` writes it).
- text edge list (any other file): ``src dst`` per line, ``#`` comments, with features and labels
  from ``.npy`` files named by :class:`Sources`.
- Dorylus binary files in a folder (or the path of its ``graph.bsnap``): ``graph.bsnap``
  (header ``{int32 4, uint32 num_vertices, uint64 num_edges}`` then uint32 ``(src, dst)`` pairs),
  ``features.bsnap`` (uint32 dimension, then float32 rows), ``labels.bsnap`` (uint32 class count,
  then one uint32 per vertex).
- ``.pt``: a saved PyG ``Data`` object (needs torch_geometric; unpickled with only PyG's data classes
  allowed, so a file that would run code is refused: ``torchfile.py``).
- an OGB node-property dataset folder (``raw/edge.csv.gz``, ..., ``split/<name>/``, or OGB's binary
  ``raw/data.npz`` and ``raw/node-label.npz``; ``data/ogb.py``).
- (a folder made by ``dorylus prepare`` is ``partition.load_dataset``'s: the partitions, put back together).

Where a file carries no split, a seeded random split of the labelled vertices is drawn.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_file
from dorylus_py.data.graph import SPLITS, Graph, class_count, random_split
from dorylus_py.data.npystream import NpyMember, npz_members
from dorylus_py.data.ogb import is_ogb_folder, ogb_hint, open_ogb
from dorylus_py.data.textblocks import line_blocks, parse_pairs
from dorylus_py.errors import DataError
from dorylus_py.settings import check_split

BSNAP_HEADER = np.dtype([("id_bytes", "<i4"), ("num_vertices", "<u4"), ("num_edges", "<u8")])


@dataclass(frozen=True)
class Sources:
    """Side files and split settings for formats that do not carry everything themselves."""

    features: str | None = None  # .npy (N, F), for edge lists
    labels: str | None = None  # .npy (N,), for edge lists
    masks: str | None = None  # .npz with train_mask/val_mask/test_mask, overrides the random split
    train_frac: float = 0.1  # random split: fraction of labelled vertices for training
    val_frac: float = 0.1  # ... for validation; the rest is the test split
    split_seed: int = 0

    def __post_init__(self):  # checked when made, before anything is read or written
        check_split(self.train_frac, self.val_frac, self.split_seed)


def load_graph(path: str | os.PathLike, sources: Sources = Sources()) -> Graph:
    """Load and validate a graph from any supported file format; raise :class:`DataError` on any problem.
    (A folder made by ``dorylus prepare`` is read by ``partition.load_dataset``.)"""
    p = Path(path)
    if str(path).startswith("s3://") or p.is_dir() and (p / "manifest.json").exists():
        raise DataError(f"{path}: a folder made by `dorylus prepare`; read it with partition.load_dataset")
    if not p.exists():
        raise DataError(f"{p}: no such file or folder")
    if not p.is_dir() and not p.is_file():  # a FIFO would hang the read
        raise DataError(f"{p}: not a regular file or folder")
    if p.is_dir():
        if (p / "graph.bsnap").exists():
            return read_bsnap(p, sources)
        if is_ogb_folder(p):
            return read_ogb(p, sources)
        hint = ogb_hint(p)
        if hint:
            raise DataError(f"{p}: {hint}")
        raise DataError(f"{p}: folder holds neither a manifest.json (from `dorylus prepare`), graph.bsnap nor an "
                        "OGB dataset (raw/edge.csv.gz or raw/data.npz)")
    if p.name.endswith(".bsnap"):
        return read_bsnap(p.parent, sources)
    if p.suffix == ".npz":
        return read_npz(p, sources)
    if p.suffix == ".pt":
        return read_pyg_file(p, sources)
    return read_edge_list(p, sources)


# --- npz -------------------------------------------------------------------------------------------


NPZ_ARRAYS = ("src", "dst", "features", "labels", "train_mask", "val_mask", "test_mask", "num_classes")


def read_npz(path: Path, sources: Sources = Sources()) -> Graph:
    names = npz_members(path, NPZ_ARRAYS)  # headers checked against the zip before any array is made
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in names}
    except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
        raise DataError(f"{path}: not a readable .npz file ({_reason(e)})") from None
    missing = [k for k in ("src", "dst", "features", "labels") if k not in arrays]
    if missing:
        raise DataError(f"{path}: missing array(s) {', '.join(missing)} (expected src, dst, features, labels)")
    masks = masks_from(arrays, path, arrays["labels"], sources)
    return Graph.from_edges(
        arrays["src"],
        arrays["dst"],
        arrays["features"],
        arrays["labels"],
        *masks,
        num_classes=class_count(arrays["num_classes"], str(path)) if "num_classes" in arrays else None,
        source=str(path),
    )


def write_npz(graph: Graph, path: str | os.PathLike) -> None:
    """Write ``graph`` in the npz layout, atomically."""
    src, dst = graph.edges()
    idx = np.int32 if graph.num_nodes < 2**31 else np.int64
    with atomic_file(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(
                f,
                src=src.astype(idx),
                dst=dst.astype(idx),
                features=graph.features,
                labels=graph.labels,
                train_mask=graph.train_mask,
                val_mask=graph.val_mask,
                test_mask=graph.test_mask,
                num_classes=np.int64(graph.num_classes),
            )


# --- text edge list --------------------------------------------------------------------------------


def read_edge_list(path: Path, sources: Sources = Sources()) -> Graph:
    """``src dst`` per line, read in bounded blocks (``data/textblocks.py``)."""
    if sources.features is None or sources.labels is None:
        raise DataError(f"{path}: an edge list needs --features FILE.npy and --labels FILE.npy")
    try:
        with open(path, "rb") as f:
            blocks = [parse_pairs(text, path, line) for line, text in line_blocks(f, path)]
    except OSError as e:
        raise DataError(f"{path}: not readable ({_reason(e)})") from None
    edges = np.concatenate(blocks) if blocks else np.zeros((0, 2), np.int64)
    del blocks
    features = _load_npy(sources.features, "features")
    labels = _load_npy(sources.labels, "labels")
    masks = masks_from({}, path, labels, sources)
    return Graph.from_edges(edges[:, 0], edges[:, 1], features, labels, *masks, source=str(path))


# --- Dorylus binary files --------------------------------------------------------------------------


def read_bsnap(folder: Path, sources: Sources = Sources()) -> Graph:
    gpath, fpath, lpath = folder / "graph.bsnap", folder / "features.bsnap", folder / "labels.bsnap"
    for p in (gpath, fpath, lpath):
        if not p.exists():
            raise DataError(f"{p}: missing (a Dorylus dataset needs graph.bsnap, features.bsnap, labels.bsnap)")
    size = gpath.stat().st_size
    if size < BSNAP_HEADER.itemsize:
        raise DataError(f"{gpath}: truncated: {size} bytes, shorter than the 16-byte header")
    header = np.fromfile(gpath, dtype=BSNAP_HEADER, count=1)[0]
    if header["id_bytes"] != 4:
        raise DataError(f"{gpath}: header says {header['id_bytes']}-byte vertex ids; only 4 is supported")
    n, m = int(header["num_vertices"]), int(header["num_edges"])
    expected = BSNAP_HEADER.itemsize + 8 * m
    if size != expected:
        raise DataError(f"{gpath}: {size} bytes, but a header of {m} edges implies {expected} (truncated or corrupt)")
    pairs = np.fromfile(gpath, dtype="<u4", offset=BSNAP_HEADER.itemsize).reshape(m, 2)

    dim = _bsnap_u32_header(fpath)
    fsize = fpath.stat().st_size
    if dim == 0 or fsize != 4 + 4 * dim * n:
        raise DataError(
            f"{fpath}: {fsize} bytes, but {n} vertices x {dim} float32 features need {4 + 4 * dim * n}"
        )
    features = np.fromfile(fpath, dtype="<f4", offset=4).reshape(n, dim)

    num_classes = _bsnap_u32_header(lpath)
    lsize = lpath.stat().st_size
    if lsize != 4 + 4 * n:
        raise DataError(f"{lpath}: {lsize} bytes, but {n} vertices need {4 + 4 * n} (one uint32 label each)")
    labels = np.fromfile(lpath, dtype="<u4", offset=4).astype(np.int64)
    if n and labels.max() >= num_classes:
        v = int(np.argmax(labels >= num_classes))
        raise DataError(f"{lpath}: label {labels[v]} of vertex {v} is out of range [0, {num_classes}) set by its header")
    masks = masks_from({}, gpath, labels, sources)
    return Graph.from_edges(
        pairs[:, 0], pairs[:, 1], features, labels, *masks, num_nodes=n, num_classes=num_classes, source=str(gpath)
    )


def write_bsnap(graph: Graph, folder: str | os.PathLike) -> None:
    """Write ``graph`` as Dorylus binary files (unlabelled vertices are not representable)."""
    folder = Path(folder)
    if (graph.labels < 0).any():
        raise DataError(f"{graph.source}: labels.bsnap has no 'unlabelled' value; every vertex needs a label")
    folder.mkdir(parents=True, exist_ok=True)
    src, dst = graph.edges()
    header = np.array([(4, graph.num_nodes, graph.num_edges)], dtype=BSNAP_HEADER)
    with atomic_file(folder / "graph.bsnap") as tmp, open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(np.stack([src, dst], axis=1).astype("<u4").tobytes())
    with atomic_file(folder / "features.bsnap") as tmp, open(tmp, "wb") as f:
        f.write(np.uint32(graph.num_features).tobytes())
        f.write(graph.features.astype("<f4").tobytes())
    with atomic_file(folder / "labels.bsnap") as tmp, open(tmp, "wb") as f:
        f.write(np.uint32(graph.num_classes).tobytes())
        f.write(graph.labels.astype("<u4").tobytes())


def _bsnap_u32_header(path: Path) -> int:
    if path.stat().st_size < 4:
        raise DataError(f"{path}: truncated: shorter than its 4-byte header")
    return int(np.fromfile(path, dtype="<u4", count=1)[0])


# --- OGB node-property dataset folders -------------------------------------------------------------


def read_ogb(path: Path, sources: Sources = Sources()) -> Graph:
    """An OGB folder whole, either layout (its split, unless ``--masks`` gives another); ``prepare`` streams it
    instead."""
    folder = open_ogb(path)
    blocks = list(folder.edge_blocks(1 << 20))
    src = np.concatenate([s for s, _ in blocks]) if blocks else np.zeros(0, np.int64)
    dst = np.concatenate([d for _, d in blocks]) if blocks else np.zeros(0, np.int64)
    del blocks
    features = np.concatenate(list(folder.feature_blocks(1 << 16)))
    labels = folder.labels()
    masks = (masks_from({}, path, labels, sources) if sources.masks is not None else folder.masks())
    return Graph.from_edges(src, dst, features, labels, *masks, num_nodes=folder.num_nodes, source=str(path))


# --- PyG -------------------------------------------------------------------------------------------


def from_pyg(data, sources: Sources = Sources(), source: str = "<pyg Data>") -> Graph:
    """Convert a PyG ``Data`` (``x``, ``y``, ``edge_index`` with messages flowing row 0 -> row 1)."""
    for attr in ("x", "y", "edge_index"):
        if _pyg_tensor(data, attr, source) is None:
            raise DataError(f"{source}: the PyG Data object has no '{attr}'")
    ei = data.edge_index.detach().cpu().numpy()
    if ei.ndim != 2 or ei.shape[0] != 2:
        raise DataError(f"{source}: edge_index must have shape (2, E), got {tuple(ei.shape)}")
    labels = data.y.detach().cpu().numpy().reshape(-1)
    arrays = {
        f"{s}_mask": getattr(data, f"{s}_mask").detach().cpu().numpy()
        for s in SPLITS
        if _pyg_tensor(data, f"{s}_mask", source) is not None
    }
    masks = masks_from(arrays, source, labels, sources)
    return Graph.from_edges(ei[0], ei[1], data.x.detach().cpu().numpy(), labels, *masks, source=source)


def _pyg_tensor(data, attr: str, source: str):
    """``data.attr``: None if absent, else a dense tensor (DataError for anything else a file put there)."""
    import torch

    try:
        value = getattr(data, attr, None)
    except RuntimeError as e:  # a Data unpickled without its attribute store
        raise DataError(f"{source}: not a whole PyG Data object ({_reason(e)})") from None
    if value is not None and not (isinstance(value, torch.Tensor) and value.layout == torch.strided):
        raise DataError(f"{source}: the PyG Data object's '{attr}' is a {type(value).__name__}, not a dense tensor")
    return value


def read_pyg_file(path: Path, sources: Sources = Sources()) -> Graph:
    """A ``torch_geometric.data.Data`` saved with ``torch.save``, unpickled with only PyG's data classes
    allowed (``torchfile.load_pt``): a file that would run code, or holds anything else, is refused."""
    try:
        from torch_geometric.data.data import Data, DataEdgeAttr, DataTensorAttr
        from torch_geometric.data.storage import GlobalStorage
    except ImportError:
        raise DataError(f"{path}: reading a PyG .pt file needs torch_geometric (pip install 'dorylus-py[bench]')") from None
    from dorylus_py.torchfile import load_pt

    # what a Data saved by PyG 2.x is made of: the object, its attribute store and two small key types
    data = load_pt(path, [Data, DataEdgeAttr, DataTensorAttr, GlobalStorage], "saved PyG Data")
    if type(data) is not Data:
        raise DataError(f"{path}: holds a {type(data).__name__}, not a PyG Data object")
    return from_pyg(data, sources, source=str(path))


# --- helpers ---------------------------------------------------------------------------------------


def masks_from(arrays: dict, path, labels, sources: Sources):
    if sources.masks is not None:
        try:
            with np.load(sources.masks, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (zipfile.BadZipFile, EOFError, ValueError, OSError) as e:
            raise DataError(f"{sources.masks}: not a readable .npz of masks ({_reason(e)})") from None
        path = sources.masks
    present = [f"{s}_mask" in arrays for s in SPLITS]
    if all(present):
        return tuple(arrays[f"{s}_mask"] for s in SPLITS)
    if any(present) or sources.masks is not None:
        missing = [f"{s}_mask" for s, p in zip(SPLITS, present) if not p]
        raise DataError(f"{path}: has some split masks but not {', '.join(missing)}")
    labels = np.asarray(labels)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.number):
        return (np.zeros(0, bool),) * 3  # let Graph validation name the label problem
    return random_split(labels.astype(np.int64), sources.train_frac, sources.val_frac, sources.split_seed)


def _load_npy(path: str, what: str) -> np.ndarray:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{path}: {what} file not found")
    if not p.is_file():  # a FIFO would hang the read
        raise DataError(f"{path}: not a regular file (the {what} must be an .npy file)")
    try:
        NpyMember(lambda: open(p, "rb"), path, p.stat().st_size)  # its header's shape against its size, first
        return np.load(p, allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise DataError(f"{path}: not a readable .npy {what} file ({_reason(e)})") from None


def _reason(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__

