"""A folder of partitions: ``manifest.json`` plus one sub-folder of ``.npy`` files per partition.

The folder may also be an ``s3://bucket/prefix`` (``partition/s3.py``): it is written by uploading a
finished local folder, and read by fetching the manifest and then only the partitions loaded.

The manifest records the format version, the graph's counts, the partitioner, edge cut and balance,
and the size and SHA-256 of every file. Loading partition ``k`` reads only ``part-k/`` (memory-mapped)
and checks sizes always and checksums by default, so a truncated or corrupt file is named, never used.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_dir
from dorylus_py.checksum import sha256_file
from dorylus_py.data.graph import Graph
from dorylus_py.errors import DataError
from dorylus_py.jsonfile import read_json
from dorylus_py.partition.layout import Partition, build_partitions, edge_cut
from dorylus_py.partition import s3
from dorylus_py.partition.partitioners import assign

FORMAT = "dorylus-partitions"
VERSION = 1


def prepare(
    graph: Graph,
    out: str | os.PathLike,
    parts: int,
    method: str = "metis",
    seed: int = 0,
    overwrite: bool = False,
    progress=None,
    delete_checkpoints: bool = False,
) -> dict:
    """Partition ``graph`` into ``parts`` and write the store at ``out`` atomically; return the manifest.
    Replacing a store whose ``checkpoints/`` holds files needs ``delete_checkpoints`` too."""
    if overwrite and not delete_checkpoints:
        from dorylus_py.checkpoint import refuse_to_delete_checkpoints  # (checkpoint imports this package)

        refuse_to_delete_checkpoints(out)
    if s3.is_s3(out):
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            manifest = prepare(graph, Path(tmp) / "store", parts, method, seed, progress=progress)
            s3.upload_store(Path(tmp) / "store", str(out), overwrite, progress)
        return manifest
    out = Path(out)
    if out.exists() and not overwrite:
        raise DataError(f"{out}: already exists (pass --overwrite to replace it)")
    say = progress or (lambda msg: None)
    t0 = time.perf_counter()
    say(f"partitioning with {method}")
    owner = assign(graph, parts, method, seed)
    t_assign = time.perf_counter() - t0
    say("building partition layouts")
    partitions = build_partitions(graph, owner)
    sizes = np.bincount(owner, minlength=parts)
    cut = edge_cut(graph, owner)
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "source": graph.source,
        "nodes": graph.num_nodes,
        "edges": graph.num_edges,
        "features": graph.num_features,
        "classes": graph.num_classes,
        "partitions": parts,
        "partitioner": method,
        "seed": seed,
        "edge_cut": cut,
        "edge_cut_fraction": cut / max(graph.num_edges, 1),
        "balance": float(sizes.max() / sizes.mean()),
        "partition_seconds": round(t_assign, 3),
        "parts": [],
    }
    out.parent.mkdir(parents=True, exist_ok=True)  # only now: a bad flag or graph leaves no folders behind
    with atomic_dir(out, overwrite=overwrite) as tmp:
        for part in partitions:
            say(f"writing partition {part.index + 1}/{parts}")
            manifest["parts"].append(_write_part(part, tmp / part_dir(part.index)))
        (tmp / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


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
            raise DataError(f"{path}: format version {manifest.get('version')} is not supported (need {VERSION})")
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
        return Partition(index=k, num_parts=self.num_parts, **arrays)

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
            rows = np.repeat(gids, np.diff(p.indptr))
            cols = col_ids[np.asarray(p.indices)]
            keep = rows != cols  # the diagonal of Â is GCN's self loop, not an edge
            srcs.append(cols[keep])
            dsts.append(rows[keep])
            features[gids] = p.features
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


def _write_part(part: Partition, folder: Path) -> dict:
    folder.mkdir()
    files = {}
    for name in Partition.ARRAYS:
        path = folder / f"{name}.npy"
        np.save(path, np.ascontiguousarray(getattr(part, name)), allow_pickle=False)
        files[path.name] = {"bytes": path.stat().st_size, "sha256": sha256_file(path)}
    return {
        "nodes": part.num_local,
        "ghosts": part.num_ghosts,
        "nnz": int(len(part.indices)),
        "sends": int(len(part.send_ids)),
        "files": files,
    }
