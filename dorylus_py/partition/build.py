"""Write every partition's layout (``partition/layout.py``) from the on-disk CSR, block by block.

One pass over the CSR finds each partition's ghosts, its rows' edge counts and the edge cut (and,
for comparison, a hash partition's). Then, one partition at a time, a pass over the CSR's row blocks
writes ``Â_LL`` and ``Â_LG`` straight into their ``.npy`` files (row counts are known, so every
file's size is), and an external sort (``data/extsort.py``) of ``Â_LL``'s transposed keys checks
whether it is symmetric and writes ``Â_LLᵀ`` only when it is not. Features are read once, in row
blocks, and each block's rows are appended to their partitions' files. Memory: a few per-vertex
arrays (ids, owners, degrees; ``K`` bytes per vertex for the ghost marks) plus one block.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dorylus_py.data.extsort import KeyBuckets
from dorylus_py.data.npystream import NpyWriter, save_npy
from dorylus_py.errors import DataError
from dorylus_py.partition.csr import DiskCSR, index_dtype
from dorylus_py.partition.layout import Partition, encode_features, storage_dtype
from dorylus_py.partition.partitioners import hash_owner
from dorylus_py.partition.source import GraphSource

FEATURE_BLOCK = 1 << 16  # feature rows read at once


class LayoutWriter:
    """Writes the layouts of ``owner``'s partitions of ``csr`` into ``folders[k]``; ``files[k]`` collects
    each file's size and SHA-256 for the manifest."""

    def __init__(self, csr: DiskCSR, owner: np.ndarray, folders: list[Path], workdir: Path, progress=None):
        self.csr, self.owner, self.folders, self.workdir = csr, owner, folders, workdir
        self.say = progress or (lambda msg: None)
        self.n, self.parts = csr.num_nodes, len(folders)
        self.dinv = 1.0 / np.sqrt(csr.in_degrees() + 1.0)  # (N,) float64: D^-1/2 with the self loop
        self.members = [np.nonzero(owner == k)[0] for k in range(self.parts)]
        self.local_rank = np.empty(self.n, dtype=index_dtype(self.n))  # row of each vertex in its partition
        for ids in self.members:
            self.local_rank[ids] = np.arange(len(ids))
        self.files: list[dict] = [{} for _ in folders]
        self.ghost_ids: list[np.ndarray] = []
        self.ghost_offsets: list[np.ndarray] = []
        self.stats: list[dict] = []

    # --- pass 1: ghosts, row counts, edge cut --------------------------------------------------

    def survey(self) -> dict:
        """Find ghosts and per-row edge counts; return the edge cut and a hash partition's cut."""
        n, owner = self.n, self.owner
        marks = np.zeros(self.parts * n, dtype=bool)  # marks[k * n + v]: v is a ghost of partition k
        self.ghost_count = np.zeros(n, dtype=np.int64)  # per row: in-edges from other partitions
        cut = hash_cut = 0
        for r0, r1 in self.csr.row_ranges():
            rows, cols = self.csr.block(r0, r1)
            o_row, o_col = owner[rows], owner[cols]
            remote = o_row != o_col
            cut += int(remote.sum())
            hash_cut += int((hash_owner(rows, self.parts) != hash_owner(cols, self.parts)).sum())
            marks[o_row[remote].astype(np.int64) * n + cols[remote]] = True
            self.ghost_count[r0:r1] = np.bincount(rows[remote] - r0, minlength=r1 - r0)
        for k in range(self.parts):
            ids = np.nonzero(marks[k * n : (k + 1) * n])[0]
            ids = ids[np.argsort(owner[ids], kind="stable")]  # by owner, then by id
            self.ghost_ids.append(ids)
            self.ghost_offsets.append(np.searchsorted(owner[ids], np.arange(self.parts + 1)).astype(np.int64))
        return {"edge_cut": cut, "hash_edge_cut": hash_cut}

    # --- pass 2: one partition's blocks ---------------------------------------------------------

    def write_structure(self, k: int) -> None:
        gids, ghosts = self.members[k], self.ghost_ids[k]
        n_k, g_k = len(gids), len(ghosts)
        deg = self.csr.in_degrees()[gids]
        ghost_deg = self.ghost_count[gids]
        local_ptr = _indptr(deg - ghost_deg + 1)  # + the self loop
        ghost_ptr = _indptr(ghost_deg)
        nnz_l, nnz_g = int(local_ptr[-1]), int(ghost_ptr[-1])
        idx = index_dtype(max(nnz_l, nnz_g, n_k, g_k) + 1)
        col = self.local_rank.astype(idx)  # a vertex's column: its local row, or (ghosts) its ghost slot
        col[ghosts] = np.arange(g_k, dtype=idx)
        folder = self.folders[k]
        files = self.files[k]
        files["global_ids.npy"] = save_npy(folder / "global_ids.npy", gids.astype(np.int64))
        files["local_indptr.npy"] = save_npy(folder / "local_indptr.npy", local_ptr.astype(idx))
        files["ghost_indptr.npy"] = save_npy(folder / "ghost_indptr.npy", ghost_ptr.astype(idx))
        local_t = KeyBuckets(self.workdir, n_k * n_k, nnz_l, name=f"llt-{k}")
        try:
            with _Writers(folder, files, {"local_indices": (idx, nnz_l), "local_weights": (np.float32, nnz_l),
                                          "ghost_indices": (idx, nnz_g), "ghost_weights": (np.float32, nnz_g)}) as w:
                for r0, r1 in self.csr.row_ranges():
                    self.say(f"partition {k + 1}/{self.parts}: rows {r0:,} of {self.n:,}")
                    self._write_block(k, r0, r1, col, w, local_t)
            symmetric = self._symmetric(local_t, folder, n_k)
            if symmetric:
                for name, dtype in (("indptr", idx), ("indices", idx), ("weights", np.float32)):
                    files[f"local_t_{name}.npy"] = save_npy(folder / f"local_t_{name}.npy", np.zeros(0, dtype))
            else:
                self._write_transpose(k, local_t, n_k, nnz_l, idx)
        finally:
            local_t.remove()
        for name, a in (("ghost_ids", ghosts.astype(np.int64)), ("ghost_offsets", self.ghost_offsets[k])):
            files[f"{name}.npy"] = save_npy(folder / f"{name}.npy", a)
        bytes_ = sum(np.load(folder / f"{a}.npy", mmap_mode="r").nbytes for a in Partition.STRUCTURE)
        self.stats.append({"nodes": n_k, "ghosts": g_k, "nnz": nnz_l + nnz_g, "nnz_local": nnz_l, "nnz_ghost": nnz_g,
                           "local_symmetric": symmetric, "index_dtype": np.dtype(idx).name,
                           "structure_bytes": bytes_})

    def _write_block(self, k, r0, r1, col, w, local_t: KeyBuckets) -> None:
        owned = self.owner[r0:r1] == k
        if not owned.any():
            return
        rows, cols = self.csr.block(r0, r1)
        keep = owned[rows - r0]
        rows, cols = rows[keep], cols[keep]
        remote = self.owner[cols] != k
        n_k = len(self.members[k])
        # Â_LL: the block's local entries are sorted by (row, column); the self loops are merged in.
        lr, lc = self.local_rank[rows[~remote]].astype(np.int64), col[cols[~remote]].astype(np.int64)
        diag = self.local_rank[r0 + np.nonzero(owned)[0]].astype(np.int64)
        at = np.searchsorted(lr * n_k + lc, diag * n_k + diag)
        lr, lc = np.insert(lr, at, diag), np.insert(lc, at, diag)
        gid = self.members[k]
        w.write("local_indices", lc)
        w.write("local_weights", self.dinv[gid[lr]] * self.dinv[gid[lc]])
        local_t.add(lc * n_k + lr)
        # Â_LG: ghost slots follow (owner, id), so with K > 2 a row's slots are sorted here.
        gr, gc = self.local_rank[rows[remote]].astype(np.int64), col[cols[remote]].astype(np.int64)
        src = cols[remote]
        keys = gr * max(len(self.ghost_ids[k]), 1) + gc
        if len(keys) > 1 and (np.diff(keys) < 0).any():
            order = np.argsort(keys, kind="stable")
            gr, gc, src = gr[order], gc[order], src[order]
        w.write("ghost_indices", gc)
        w.write("ghost_weights", self.dinv[gid[gr]] * self.dinv[src])

    def _write_transpose(self, k, buckets: KeyBuckets, n_k: int, nnz: int, idx) -> None:
        """``local_t_indptr/indices/weights``: ``Â_LLᵀ`` from its keys ``row_t * n_k + col_t``."""
        folder, files, gids = self.folders[k], self.files[k], self.members[k]
        counts = np.zeros(n_k, dtype=np.int64)
        with _Writers(folder, files, {"local_t_indices": (idx, nnz), "local_t_weights": (np.float32, nnz)}) as w:
            for _, keys in buckets.sorted_buckets():
                r, c = keys // n_k, keys % n_k
                if len(r):
                    counts[r[0] : r[-1] + 1] += np.bincount(r - r[0])
                w.write("local_t_indices", c)
                w.write("local_t_weights", self.dinv[gids[r]] * self.dinv[gids[c]])
        files["local_t_indptr.npy"] = save_npy(folder / "local_t_indptr.npy", _indptr(counts).astype(idx))

    def _symmetric(self, local_t: KeyBuckets, folder: Path, n_k: int) -> bool:
        """Whether ``Â_LL`` equals its transpose: every sorted bucket of transposed keys must equal the
        stored keys of the same range (equal totals then make the sets equal)."""
        ptr = np.load(folder / "local_indptr.npy").astype(np.int64)
        ind = np.load(folder / "local_indices.npy", mmap_mode="r")
        local_t.compact()
        for b in range(local_t.count):
            keys = local_t.load(b)
            if not len(keys):
                continue
            lo, hi = b * local_t.width, (b + 1) * local_t.width
            r0, r1 = int(keys[0] // n_k), int(keys[-1] // n_k) + 1
            rows = np.repeat(np.arange(r0, r1, dtype=np.int64), np.diff(ptr[r0 : r1 + 1]))
            stored = rows * n_k + np.asarray(ind[ptr[r0] : ptr[r1]], dtype=np.int64)
            stored = stored[(stored >= lo) & (stored < hi)]
            if not np.array_equal(stored, keys):
                return False
        return True

    # --- per-vertex data --------------------------------------------------------------------------

    def write_vertex_data(self, source: GraphSource, feature_dtype: str) -> dict:
        """Labels, masks, send lists and features of every partition; return feature facts."""
        for k, gids in enumerate(self.members):
            files, folder = self.files[k], self.folders[k]
            arrays = {"labels": source.labels[gids], "train_mask": source.masks[0][gids],
                      "val_mask": source.masks[1][gids], "test_mask": source.masks[2][gids]}
            wanted = [self.local_rank[self.ghost_ids[p][self.ghost_offsets[p][k] : self.ghost_offsets[p][k + 1]]]
                      for p in range(self.parts)]
            arrays["send_ids"] = np.concatenate(wanted).astype(np.int64)
            arrays["send_offsets"] = _indptr(np.array([len(w) for w in wanted]))
            for name, a in arrays.items():
                files[f"{name}.npy"] = save_npy(folder / f"{name}.npy", a)
            self.stats[k]["sends"] = len(arrays["send_ids"])
        return self._write_features(source, feature_dtype)

    def _write_features(self, source: GraphSource, dtype: str) -> dict:
        f = source.num_features
        handles = [open(folder / "features.npy", "wb") for folder in self.folders]
        low = np.inf
        try:
            writers = [NpyWriter(h, storage_dtype(dtype), (len(m), f), "features") for h, m in zip(handles, self.members)]
            start = 0
            for block in source.feature_blocks(FEATURE_BLOCK):
                self.say(f"features: {start:,} of {self.n:,} rows")
                low = min(low, float(block.min())) if block.size else low
                stored = encode_features(block, dtype)
                if dtype == "float16" and not np.isfinite(stored).all():
                    raise DataError(f"{source.name}: features exceed float16's range (±65504); use "
                                    "--feature-dtype bfloat16 or float32")
                o = self.owner[start : start + len(block)]
                for k, w in enumerate(writers):
                    w.write(stored[o == k])
                start += len(block)
            shas = [w.finish() for w in writers]
        finally:
            for h in handles:
                h.close()
        for k, folder in enumerate(self.folders):
            self.files[k]["features.npy"] = {"bytes": (folder / "features.npy").stat().st_size, "sha256": shas[k]}
        return {"feature_min": low, "features_nonnegative": bool(low >= 0)}


class _Writers:
    """Several ``.npy`` files of known lengths in one folder, appended to together."""

    def __init__(self, folder: Path, files: dict, specs: dict):
        self.folder, self.files, self.specs = folder, files, specs

    def __enter__(self):
        self.handles = {name: open(self.folder / f"{name}.npy", "wb") for name in self.specs}
        self.writers = {name: NpyWriter(self.handles[name], dtype, (size,), name)
                        for name, (dtype, size) in self.specs.items()}
        return self

    def write(self, name: str, block: np.ndarray) -> None:
        self.writers[name].write(block)

    def __exit__(self, kind, *rest):
        try:
            if kind is None:
                for name, w in self.writers.items():
                    self.files[f"{name}.npy"] = {"sha256": w.finish()}
        finally:
            for h in self.handles.values():
                h.close()
        if kind is None:
            for name in self.writers:
                self.files[f"{name}.npy"]["bytes"] = (self.folder / f"{name}.npy").stat().st_size


def _indptr(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out

