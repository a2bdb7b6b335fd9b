"""A folder of partitions: ``manifest.json`` plus one sub-folder of ``.npy`` files per partition.

The folder may also be an ``s3://bucket/prefix`` (``s3.py``): it is written by uploading a
finished local folder, and read by fetching the manifest and then only the partitions loaded.

:func:`prepare` streams (``source.py`` -> ``csr.py`` -> ``partitioners.py`` -> ``build.py``): the
graph is never held in memory, only per-vertex arrays and one block of edges, so its peak memory is
a few hundred bytes per vertex whatever the edge count (METIS, when chosen, needs its own). The
manifest records the format version, the graph's counts and split sizes (so a driver needs nothing
else), the partitioner and why, edge cut beside a hash partition's, balance, and the size and SHA-256
of every file; ``--overwrite`` replaces a folder only if it holds nothing but those files (and,
with ``--delete-checkpoints``, the checkpoints a run kept there). Loading partition ``k`` reads only
``part-k/`` (memory-mapped) and checks sizes always and checksums by default, so a truncated or
corrupt file is named, never used.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from dorylus_py import s3
from dorylus_py.atomic import Owned, atomic_dir, check_replaceable, remove_owned
from dorylus_py.checksum import sha256_file
from dorylus_py.data.graph import MAX_CLASSES, Graph
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jsonfile import read_json
from dorylus_py.partition.build import LayoutWriter
from dorylus_py.partition.csr import DiskCSR, build_csr, symmetrized
from dorylus_py.partition.layout import FEATURE_DTYPES, Partition, decode_features
from dorylus_py.partition.partitioners import (
    check_parts,
    choose,
    fennel,
    fill_empty,
    hash_owner,
    metis,
)
from dorylus_py.partition.source import GraphSource, graph_source

FORMAT = "dorylus-partitions"
VERSION = 2  # 2: Â in local/ghost blocks with the ghost transpose, int32 indices, feature dtype, counts


def prepare(
    data: Graph | GraphSource,
    out: str | os.PathLike,
    parts: int,
    method: str = "auto",
    seed: int = 0,
    overwrite: bool = False,
    progress=None,
    feature_dtype: str = "float32",
    memory_budget: int | None = None,
    scratch: str | os.PathLike | None = None,
    delete_checkpoints: bool = False,
) -> dict:
    """Partition ``data`` into ``parts`` and write the store at ``out`` atomically; return the manifest.

    ``method``: ``auto`` | ``metis`` | ``fennel`` | ``hash``; ``memory_budget`` (bytes) decides ``auto``
    (default: 3/4 of the memory available); ``scratch``: folder for temporary files (default: beside ``out``).
    Replacing a store whose ``checkpoints/`` holds files needs ``delete_checkpoints`` too.
    """
    source = data if isinstance(data, GraphSource) else graph_source(data)
    check_parts(parts, source.num_nodes, source.name, method)
    if feature_dtype not in FEATURE_DTYPES:
        raise ConfigError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPES)}, got {feature_dtype!r}")
    if s3.is_s3(out) and overwrite and not delete_checkpoints:
        refuse_to_delete_checkpoints(out)
    if s3.is_s3(out) and overwrite:
        check_s3_replaceable(str(out), delete_checkpoints)
    if s3.is_s3(out):
        with tempfile.TemporaryDirectory(dir=scratch) as tmp:
            manifest = prepare(source, Path(tmp) / "store", parts, method, seed, False, progress, feature_dtype,
                               memory_budget, tmp)
            s3.upload_store(Path(tmp) / "store", str(out), overwrite, progress)
        return manifest
    out = Path(out)
    check_store_out(out, overwrite, delete_checkpoints)
    say = progress or (lambda msg: None)
    made = _make_parents(out.parent)
    try:
        return _prepare_into(source, out, parts, method, seed, store_files(out, delete_checkpoints), feature_dtype,
                             memory_budget, scratch, say)
    except BaseException:
        for folder in made:  # a failure leaves no folders behind (the store's own is atomic)
            folder.rmdir()
        raise


def _prepare_into(source, out: Path, parts, method, seed, owned, feature_dtype, memory_budget, scratch, say) -> dict:
    seconds = {}
    t0 = time.perf_counter()
    with atomic_dir(out, owned) as tmp, tempfile.TemporaryDirectory(
        prefix=".prepare-", dir=scratch or out.parent
    ) as work:
        work = Path(work)
        csr = build_csr(source, work, say)
        seconds["csr"] = time.perf_counter() - t0
        note = ""
        if method == "auto":
            method, note = choose(csr.num_nodes, csr.num_edges, parts, memory_budget)
            say(f"partitioner auto: {note}")
        owner = _assign(csr, parts, method, seed, work, say)
        seconds["partition"] = time.perf_counter() - t0 - sum(seconds.values())
        folders = [tmp / part_dir(k) for k in range(parts)]
        for folder in folders:
            folder.mkdir()
        writer = LayoutWriter(csr, owner, folders, work, say)
        cuts = writer.survey()
        for k in range(parts):
            writer.write_structure(k)
        seconds["layout"] = time.perf_counter() - t0 - sum(seconds.values())
        features = writer.write_vertex_data(source, feature_dtype)
        seconds["features"] = time.perf_counter() - t0 - sum(seconds.values())
        manifest = _manifest(source, csr, owner, parts, method, note, seed, cuts, features, feature_dtype, seconds)
        manifest["parts"] = [stats | {"files": files} for stats, files in zip(writer.stats, writer.files)]
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _make_parents(folder: Path) -> list[Path]:
    """Create ``folder`` and its missing parents; return those created, deepest first."""
    missing = [p for p in [folder, *folder.parents] if not p.exists()]
    folder.mkdir(parents=True, exist_ok=True)
    return missing


def _assign(csr: DiskCSR, parts: int, method: str, seed: int, work: Path, say) -> np.ndarray:
    if parts == 1:
        return np.zeros(csr.num_nodes, dtype=np.int64)
    say(f"partitioning with {method}")
    if method == "metis":
        sym = symmetrized(csr, work)
        owner = metis(sym.indptr, sym.indices, parts, seed)
    elif method == "fennel":
        owner = fennel(csr.indptr, csr.indices, parts, seed, progress=say)
    else:
        owner = hash_owner(np.arange(csr.num_nodes), parts)
    return fill_empty(owner.astype(np.int64), parts)


def _manifest(source, csr, owner, parts, method, note, seed, cuts, features, feature_dtype, seconds) -> dict:
    sizes = np.bincount(owner, minlength=parts)
    deg = csr.in_degrees()
    edges = max(csr.num_edges, 1)
    summary = {"nodes": csr.num_nodes, "edges": csr.num_edges, "features": source.num_features,
               "classes": source.num_classes, **source.summary_counts(),
               "max_in_degree": int(deg.max()) if len(deg) else 0, "mean_in_degree": float(deg.mean()) if len(deg) else 0.0,
               "isolated": int((deg == 0).sum())}
    return {
        "format": FORMAT,
        "version": VERSION,
        "source": source.name,
        "nodes": csr.num_nodes,
        "edges": csr.num_edges,
        "features": source.num_features,
        "classes": source.num_classes,
        "summary": summary,
        "feature_dtype": feature_dtype,
        **features,
        "partitions": parts,
        "partitioner": method,
        "partitioner_note": note,
        "seed": seed,
        "edge_cut": cuts["edge_cut"],
        "edge_cut_fraction": cuts["edge_cut"] / edges,
        "hash_edge_cut": cuts["hash_edge_cut"],
        "hash_edge_cut_fraction": cuts["hash_edge_cut"] / edges,
        "balance": float(sizes.max() / sizes.mean()),
        "seconds": {k: round(v, 3) for k, v in seconds.items()},
    }


def part_dir(k: int) -> str:
    return f"part-{k:05d}"


class PartitionStore:
    """Read access to a folder written by :func:`prepare`."""

    def __init__(self, root: Path, manifest: dict, remote: str | None = None):
        self.root = root  # a local folder; for an s3:// store, its cache
        self.manifest = manifest
        self.remote = remote

    @classmethod
    def open(cls, root: str | os.PathLike) -> "PartitionStore":
        if s3.is_s3(root):  # cached per manifest version: a re-prepared store never reads stale files
            cache = s3.cache_dir(str(root))
            fetched = s3.fetch(str(root), "manifest.json", cache / f"manifest.{os.getpid()}.json")
            version = cache / sha256_file(fetched)[:16]
            version.mkdir(parents=True, exist_ok=True)
            os.replace(fetched, version / "manifest.json")  # other processes may do the same: same content
            store = cls.open(version)
            store.remote = str(root)
            return store
        root = Path(root)
        path = root / "manifest.json"
        manifest = read_json(path, DataError, f"missing; is {root} a folder made by `dorylus prepare`?")
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise DataError(f"{path}: not a dorylus partition manifest")
        if manifest.get("version") != VERSION:
            raise DataError(f"{path}: format version {manifest.get('version')} is not supported (need {VERSION}); "
                            f"prepare the dataset again with this dorylus (`dorylus prepare`)")
        classes = manifest.get("classes")  # sizes every output layer: a count no labels could make is refused
        if type(classes) is not int or not 2 <= classes <= MAX_CLASSES:
            raise DataError(f"{path}: classes {str(classes)[:40]} is not a class count in [2, {MAX_CLASSES:,}]")
        if len(manifest.get("parts", [])) != manifest.get("partitions"):
            raise DataError(f"{path}: lists {len(manifest.get('parts', []))} parts, expected {manifest.get('partitions')}")
        return cls(root, manifest)

    @property
    def num_parts(self) -> int:
        return self.manifest["partitions"]

    def load(self, k: int, verify: bool = True) -> Partition:
        """Load partition ``k`` (memory-mapped); check sizes, and checksums when ``verify``."""
        if not 0 <= k < self.num_parts:
            raise DataError(f"{self.root}: partition {k} out of range [0, {self.num_parts})")
        folder = self.root / part_dir(k)
        files = self.manifest["parts"][k]["files"]
        arrays = {}
        for name in Partition.ARRAYS:
            path = folder / f"{name}.npy"
            meta = files.get(f"{name}.npy")
            if meta is None:
                raise DataError(f"{self.root / 'manifest.json'}: no entry for {part_dir(k)}/{name}.npy")
            if self.remote:  # fetched and checked against the manifest, named by its s3:// address
                s3.fetch(self.remote, f"{part_dir(k)}/{name}.npy", path, meta["bytes"], meta["sha256"] if verify else None)
            if not path.exists():
                raise DataError(f"{path}: missing")
            if path.stat().st_size != meta["bytes"]:
                raise DataError(f"{path}: {path.stat().st_size} bytes, manifest says {meta['bytes']} (truncated?)")
            if verify and not self.remote and sha256_file(path) != meta["sha256"]:
                raise DataError(f"{path}: checksum mismatch with the manifest (corrupt file)")
            try:
                arrays[name] = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as e:
                raise DataError(f"{path}: unreadable ({e})") from None
        return Partition(index=k, num_parts=self.num_parts, feature_dtype=self.manifest["feature_dtype"], **arrays)

    def assemble(self, verify: bool = True) -> Graph:
        """Put every partition back together into the original :class:`Graph`."""
        m = self.manifest
        n = m["nodes"]
        features = np.empty((n, m["features"]), dtype=np.float32)
        labels = np.empty(n, dtype=np.int64)
        masks = [np.empty(n, dtype=bool) for _ in range(3)]
        srcs, dsts = [], []
        for k in range(self.num_parts):
            p = self.load(k, verify)
            gids = np.asarray(p.global_ids)
            col_ids = np.concatenate([gids, np.asarray(p.ghost_ids)])
            indptr, indices, _ = p.combined_csr()
            rows = np.repeat(gids, np.diff(indptr))
            cols = col_ids[indices]
            keep = rows != cols  # the diagonal of Â is GCN's self loop, not an edge
            srcs.append(cols[keep])
            dsts.append(rows[keep])
            features[gids] = decode_features(p.features, p.feature_dtype)
            labels[gids] = p.labels
            for mask, part_mask in zip(masks, (p.train_mask, p.val_mask, p.test_mask)):
                mask[gids] = part_mask
        return Graph.from_edges(
            np.concatenate(srcs),
            np.concatenate(dsts),
            features,
            labels,
            *masks,
            num_classes=m["classes"],
            source=self.remote or str(self.root),
        )


def store_files(root: Path, checkpoints: bool = False) -> Owned:
    """What `dorylus prepare` wrote in ``root``, by what its manifest lists (nothing without one), and with
    ``checkpoints`` the files a run's checkpoints left in ``root/checkpoints``: what ``--overwrite`` may
    delete. A manifest naming paths outside its folder names nothing found in it."""
    try:
        text = (root / "manifest.json").read_bytes()
    except OSError:
        text = None
    return manifest_files(text, checkpoints)


def manifest_files(text: bytes | None, checkpoints: bool = False) -> Owned:
    """:func:`store_files` from the manifest's bytes (None: there is none), for a folder or an ``s3://`` prefix."""
    from dorylus_py.checkpoint import is_checkpoint_file

    names = set()
    try:
        manifest = json.loads(text) if text is not None else {}
        if manifest.get("format") == FORMAT:
            names = {"manifest.json"} | {f"{part_dir(k)}/{name}" for k, part in enumerate(manifest["parts"])
                                         for name in part["files"] if isinstance(name, str)}
    except (ValueError, TypeError, KeyError, AttributeError):
        pass  # not a store's manifest: nothing here is a store's
    folders = {n.split("/")[0] for n in names if "/" in n}

    def owned(rel: str, is_dir: bool) -> bool:
        top, _, rest = rel.partition("/")
        if checkpoints and top == "checkpoints":
            return not rest if is_dir else is_checkpoint_file(rest)
        return rel in folders if is_dir else rel in names

    return owned


def check_store_out(out: Path, overwrite: bool, delete_checkpoints: bool = False) -> None:
    """A local folder :func:`prepare` may write: a new one, or with ``overwrite`` a store holding only its
    own files (and its checkpoints' only with ``delete_checkpoints``); checked before anything is read."""
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise DataError(f"{out}: already exists (pass --overwrite to replace it)")
    if not delete_checkpoints:
        refuse_to_delete_checkpoints(out)
    check_replaceable(out, store_files(out, delete_checkpoints), True, "a prepared store's files")


def delete_store(root: Path) -> None:
    """Delete what `dorylus prepare` wrote in ``root``, and ``root`` once empty; anything else in it stays
    (with a line saying so)."""
    import logging

    if not root.is_dir() or root.is_symlink():
        return
    try:
        remove_owned(root, store_files(root))
        root.rmdir()
    except (ConfigError, OSError) as e:
        logging.getLogger(__name__).warning("%s: kept (%s)", root, e)


def checkpoint_root(store: str) -> str:
    return f"{str(store).rstrip('/')}/checkpoints"


MAX_MANIFEST_BYTES = 64 * 2**20  # a manifest lists every part's files: a few KB a part, thousands of parts


def check_s3_replaceable(uri: str, delete_checkpoints: bool) -> None:
    """``prepare --overwrite`` to an ``s3://`` prefix deletes every object under it: refuse, deleting
    nothing, when any is not what its manifest lists (nor, with ``delete_checkpoints``, a checkpoint file)."""
    names = s3.list_names(uri)
    owned = manifest_files(s3.read_small(uri, "manifest.json", MAX_MANIFEST_BYTES) if names else None,
                           delete_checkpoints)
    other = sorted(n for n in names if not owned(n, False))
    if other:
        shown = ", ".join(n[:80] for n in other[:3]) + (", ..." if len(other) > 3 else "")
        raise ConfigError(f"{uri}: holds {len(other)} object(s) that dorylus did not write ({shown}); "
                          "nothing was deleted")


def refuse_to_delete_checkpoints(store) -> None:
    """Raise if replacing ``store`` would delete checkpoints: the weights of training runs, which
    re-partitioning cannot bring back."""
    root = checkpoint_root(str(store))
    if s3.is_s3(root):
        found = s3.count_objects(root)
    else:
        found = sum(1 for p in Path(root).rglob("*") if p.is_file()) if Path(root).is_dir() else 0
    if found:
        raise DataError(f"{root}: holds {found} checkpoint files that --overwrite would delete; move them away first, "
                        "or pass --delete-checkpoints as well")
