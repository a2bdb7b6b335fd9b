"""Synthetic graphs: a degree-corrected stochastic block model with power-law degrees.

Each vertex gets a class (its block) and a Pareto-distributed degree propensity ``theta``. Each
undirected edge picks its first end proportionally to ``theta``; with probability ``homophily`` the
second end is drawn the same way from the first end's block, otherwise from the whole graph. Features
are a per-class centroid scaled by ``feature_signal`` plus unit Gaussian noise, so features alone
classify weakly and the graph's homophily helps: the regime in which a GNN is worth training.

:func:`write_synth` streams: edges are sampled in blocks, de-duplicated on disk (``data/extsort.py``)
and written with the features straight into the ``.npz``, so memory stays at a few per-vertex arrays
plus one block (1.04 GB measured for 10 M vertices / 200 M edges). Seeded: the same config
writes the same file. :func:`generate` returns the same graph in memory, for small graphs.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import numpy as np

from dorylus_py.atomic import atomic_file
from dorylus_py.config import (
    SynthConfig,  # defined there so that `dorylus synth --help` needs no numpy
)
from dorylus_py.data.extsort import KeyBuckets
from dorylus_py.data.graph import Graph, random_split
from dorylus_py.data.npystream import NpzWriter

SAMPLE_BLOCK = 1 << 21  # edges sampled at once
FEATURE_BLOCK = 1 << 16  # feature rows generated at once


def generate(cfg: SynthConfig, progress=None) -> Graph:
    """The graph :func:`write_synth` writes for ``cfg``, in memory (for graphs that fit several times)."""
    from dorylus_py.data.formats import read_npz

    with tempfile.TemporaryDirectory(prefix="dorylus-synth-") as tmp:
        path = Path(tmp) / "graph.npz"
        write_synth(cfg, path, progress, scratch=Path(tmp))
        graph = read_npz(path)
    return dataclasses.replace(graph, source=f"synth(seed={cfg.seed})")


def write_synth(cfg: SynthConfig, out: Path, progress=None, scratch: Path | None = None) -> dict:
    """Generate the graph described by ``cfg`` into the ``.npz`` ``out`` (atomically); return its counts.

    ``scratch``: where the edge buckets go (default: beside ``out``); ``progress``: callable taking a message.
    """
    cfg.check()
    say = progress or (lambda msg: None)
    out = Path(out)
    rng = np.random.default_rng(cfg.seed)
    n, c = cfg.nodes, cfg.classes
    labels = rng.integers(0, c, size=n, dtype=np.int64)
    labels[rng.permutation(n)[:c]] = np.arange(c)  # every class present
    # Pareto propensities, capped so that no hub takes more than ~sqrt(E) edges.
    theta = (1.0 - rng.random(n)) ** (-1.0 / (cfg.degree_exponent - 1.0))
    theta = np.minimum(theta, max(1.0, np.sqrt(cfg.edges) / max(cfg.edges / n, 1.0)))
    masks = random_split(labels, cfg.train_frac, cfg.val_frac, cfg.seed)
    idx = np.int32 if n < 2**31 else np.int64
    with tempfile.TemporaryDirectory(prefix=".synth-", dir=scratch or out.parent) as tmp:
        buckets = KeyBuckets(Path(tmp), n * n, cfg.edges // 2, name="edges")
        try:
            kept = _sample_edges(cfg, rng, labels, theta, buckets, say)
            with atomic_file(out) as tmp_out:
                z = NpzWriter(tmp_out)
                try:
                    say(f"writing {2 * kept:,} edges")
                    z.member("src", idx, (2 * kept,), _directed(buckets, n, idx, reverse=False))
                    z.member("dst", idx, (2 * kept,), _directed(buckets, n, idx, reverse=True))
                    say("generating features")
                    z.member("features", np.float32, (n, cfg.features), _features(cfg, rng, labels))
                    z.member("labels", np.int64, (n,), [labels])
                    for name, mask in zip(("train_mask", "val_mask", "test_mask"), masks):
                        z.member(name, bool, (n,), [mask])
                    z.member("num_classes", np.int64, (), [np.int64(c)])
                finally:
                    z.close()
        finally:
            buckets.remove()
    return {"nodes": n, "edges": 2 * kept, "features": cfg.features, "classes": c,
            "train": int(masks[0].sum()), "val": int(masks[1].sum()), "test": int(masks[2].sum())}


def _sample_edges(cfg: SynthConfig, rng, labels, theta, buckets: KeyBuckets, say) -> int:
    """Fill ``buckets`` with exactly ``edges // 2`` distinct undirected keys ``a * n + b`` (a < b), if
    the model can reach that many in 20 rounds; return how many it holds."""
    n = cfg.nodes
    target = cfg.edges // 2  # undirected edges wanted
    order = np.argsort(labels, kind="stable")  # vertices grouped by block
    cum_all = np.cumsum(theta)
    cum_block = np.cumsum(theta[order])
    block_end = np.cumsum(np.bincount(labels, minlength=cfg.classes))  # exclusive ends in `order`
    hi = cum_block[block_end - 1]
    lo = np.concatenate([[0.0], hi[:-1]])

    have = 0
    for _ in range(20):  # each round tops up what duplicates and self loops took away
        want = target - have
        if want <= 0:
            break
        m = int(want * 1.05) + 16
        for start in range(0, m, SAMPLE_BLOCK):
            say(f"sampling edges: {have + start:,} of {target:,}")
            size = min(SAMPLE_BLOCK, m - start)
            # The first ends are drawn sorted (binary search is much faster on sorted needles); the
            # edge set's distribution is unchanged, as each second end is drawn after its first.
            u = np.minimum(np.searchsorted(cum_all, np.sort(rng.random(size)) * cum_all[-1], side="right"), n - 1)
            inside = rng.random(size) < cfg.homophily
            r = rng.random(size)
            v = np.empty(size, dtype=np.int64)
            bu = labels[u[inside]]
            pos = np.searchsorted(cum_block, lo[bu] + r[inside] * (hi[bu] - lo[bu]), side="right")
            v[inside] = order[np.minimum(pos, block_end[bu] - 1)]
            v[~inside] = np.minimum(np.searchsorted(cum_all, r[~inside] * cum_all[-1], side="right"), n - 1)
            a, b = np.minimum(u, v), np.maximum(u, v)
            fresh = a != b
            buckets.add(a[fresh] * n + b[fresh])
        have = buckets.compact()
    if have > target:  # drop a uniformly random subset of the excess, bucket by bucket
        drops = rng.multivariate_hypergeometric(buckets.sizes, have - target, method="marginals")
        for b in np.nonzero(drops)[0]:
            keys = buckets.load(b)
            keep = np.ones(len(keys), dtype=bool)
            keep[rng.choice(len(keys), size=int(drops[b]), replace=False)] = False
            buckets.store(b, keys[keep])
        have = target
    return have


def _directed(buckets: KeyBuckets, n: int, dtype, reverse: bool):
    """Both directions of every undirected key: bucket by bucket, ``a -> b`` then ``b -> a``."""
    for b in range(buckets.count):
        keys = buckets.load(b)
        a, z = keys // n, keys % n
        yield (np.concatenate([z, a]) if reverse else np.concatenate([a, z])).astype(dtype)


def _features(cfg: SynthConfig, rng, labels):
    centroids = (rng.standard_normal((cfg.classes, cfg.features)) * cfg.feature_signal).astype(np.float32)
    for i in range(0, cfg.nodes, FEATURE_BLOCK):
        rows = slice(i, min(i + FEATURE_BLOCK, cfg.nodes))
        x = rng.standard_normal((rows.stop - rows.start, cfg.features), dtype=np.float32)
        x += centroids[labels[rows]]
        yield x
