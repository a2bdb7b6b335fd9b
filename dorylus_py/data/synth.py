"""Synthetic graphs: a degree-corrected stochastic block model with power-law degrees.

Each vertex gets a class (its block) and a Pareto-distributed degree propensity ``theta``. Each
undirected edge picks its first end proportionally to ``theta``; with probability ``homophily`` the
second end is drawn the same way from the first end's block, otherwise from the whole graph. Features
are a per-class centroid scaled by ``feature_signal`` plus unit Gaussian noise, so features alone
classify weakly and the graph's homophily helps: the regime in which a GNN is worth training.
Everything is vectorised and seeded; 1 M vertices and 20 M directed edges take well under a minute.
"""

from __future__ import annotations

import numpy as np

from dorylus_py.config import SynthConfig  # defined there so that `dorylus synth --help` needs no numpy
from dorylus_py.data.graph import Graph, random_split


def generate(cfg: SynthConfig, progress=None) -> Graph:
    """Generate the graph described by ``cfg`` (``progress``: optional callable taking a message)."""
    cfg.check()
    say = progress or (lambda msg: None)
    rng = np.random.default_rng(cfg.seed)
    n, c = cfg.nodes, cfg.classes
    labels = rng.integers(0, c, size=n, dtype=np.int64)
    labels[rng.permutation(n)[:c]] = np.arange(c)  # every class present
    # Pareto propensities, capped so that no hub takes more than ~sqrt(E) edges.
    theta = (1.0 - rng.random(n)) ** (-1.0 / (cfg.degree_exponent - 1.0))
    theta = np.minimum(theta, max(1.0, np.sqrt(cfg.edges) / max(cfg.edges / n, 1.0)))

    say("sampling edges")
    src, dst = _sample_edges(cfg, rng, labels, theta)
    say("generating features")
    features = _features(cfg, rng, labels)
    masks = random_split(labels, cfg.train_frac, cfg.val_frac, cfg.seed)
    say("building CSR")
    return Graph.from_edges(src, dst, features, labels, *masks, num_classes=c, source=f"synth(seed={cfg.seed})")


def _sample_edges(cfg: SynthConfig, rng, labels, theta) -> tuple[np.ndarray, np.ndarray]:
    n = cfg.nodes
    target = cfg.edges // 2  # undirected edges wanted
    order = np.argsort(labels, kind="stable")  # vertices grouped by block
    cum_all = np.cumsum(theta)
    cum_block = np.cumsum(theta[order])
    block_end = np.cumsum(np.bincount(labels, minlength=cfg.classes))  # exclusive ends in `order`
    hi = cum_block[block_end - 1]
    lo = np.concatenate([[0.0], hi[:-1]])

    keys = np.empty(0, dtype=np.int64)
    for _ in range(20):  # each round tops up what duplicates and self loops took away
        want = target - len(keys)
        if want <= 0:
            break
        m = int(want * 1.05) + 16
        u = np.minimum(np.searchsorted(cum_all, rng.random(m) * cum_all[-1], side="right"), n - 1)
        inside = rng.random(m) < cfg.homophily
        r = rng.random(m)
        v = np.empty(m, dtype=np.int64)
        bu = labels[u[inside]]
        pos = np.searchsorted(cum_block, lo[bu] + r[inside] * (hi[bu] - lo[bu]), side="right")
        v[inside] = order[np.minimum(pos, block_end[bu] - 1)]
        v[~inside] = np.minimum(np.searchsorted(cum_all, r[~inside] * cum_all[-1], side="right"), n - 1)
        a, b = np.minimum(u, v), np.maximum(u, v)
        fresh = a != b
        keys = np.unique(np.concatenate([keys, a[fresh] * n + b[fresh]]))
    if len(keys) > target:
        keys = rng.choice(keys, size=target, replace=False)
    a, b = keys // n, keys % n
    return np.concatenate([a, b]), np.concatenate([b, a])


def _features(cfg: SynthConfig, rng, labels, block: int = 1 << 16) -> np.ndarray:
    centroids = (rng.standard_normal((cfg.classes, cfg.features)) * cfg.feature_signal).astype(np.float32)
    x = np.empty((cfg.nodes, cfg.features), dtype=np.float32)
    for i in range(0, cfg.nodes, block):
        rows = slice(i, min(i + block, cfg.nodes))
        x[rows] = rng.standard_normal((rows.stop - rows.start, cfg.features), dtype=np.float32)
        x[rows] += centroids[labels[rows]]
    return x
