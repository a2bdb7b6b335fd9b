"""Reference trainer vs PyG's GCNConv: median epoch time on the same graph with the same threads.

Graph: synthetic, 200 k vertices, 4 M directed edges, 128 features, 10 classes; 2-layer GCN, 16 hidden.
An epoch is what training does each step: forward with dropout, loss, backward, Adam step.
Target (2 cores): reference <= 0.2x PyG.

    python benchmarks/bench_reference.py [--nodes 200000 --edges 4000000 --epochs 20 --threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
import torch.nn.functional as F

from dorylus_py.config import TrainConfig
from dorylus_py.data import SynthConfig, generate
from dorylus_py.kernels import NormalizedAdjacency
from dorylus_py.models.gcn import GCN
from dorylus_py.training.reference import model_dims


def pyg_model(graph, cfg: TrainConfig, device: str = "cpu"):
    """PyG's GCN (GCNConv, cached normalisation, no bias) and its training step on ``graph``, on ``device``
    (gpu_check.py times it on the GPU its `gpu` backend uses)."""
    from torch_geometric.nn import GCNConv

    class PyGGCN(torch.nn.Module):
        def __init__(self, dims):
            super().__init__()
            self.convs = torch.nn.ModuleList(
                GCNConv(a, b, bias=False, cached=True) for a, b in zip(dims[:-1], dims[1:])
            )

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = F.dropout(x, cfg.dropout, self.training)
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = F.relu(x)
            return x

    src, dst = graph.edges()
    edge_index = torch.from_numpy(np.stack([src, dst])).to(device)
    x = torch.from_numpy(graph.features).to(device)
    y = torch.from_numpy(graph.labels).to(device)
    train = torch.from_numpy(graph.train_mask).nonzero().squeeze(1).to(device)
    model = PyGGCN(model_dims(cfg, graph)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)

    def step():
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(x, edge_index)[train], y[train])
        loss.backward()
        opt.step()

    return model, step, x, edge_index


def pyg_epoch_times(graph, cfg: TrainConfig, epochs: int) -> list[float]:
    _, step, _, _ = pyg_model(graph, cfg)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return times[1:]  # the first epoch builds PyG's cached normalisation


def reference_epoch_times(graph, cfg: TrainConfig, epochs: int) -> list[float]:
    """The reference trainer's training step (its epochs also run an evaluation forward, timed apart)."""
    adj = NormalizedAdjacency.for_graph(graph)
    x = torch.from_numpy(graph.features)
    y = torch.from_numpy(graph.labels)
    train = torch.from_numpy(graph.train_mask).nonzero().squeeze(1)
    model = GCN(model_dims(cfg, graph), cfg.dropout)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr)
    times = []
    for epoch in range(epochs):
        t0 = time.perf_counter()
        model.train()
        opt.zero_grad()
        loss = F.cross_entropy(model(adj, x, epoch)[train], y[train])
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return times[1:]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=4_000_000)
    ap.add_argument("--features", type=int, default=128)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    graph = generate(SynthConfig(nodes=args.nodes, edges=args.edges, features=args.features, classes=10))
    cfg = TrainConfig(epochs=args.epochs, threads=args.threads, feature_norm="none")
    ref = statistics.median(reference_epoch_times(graph, cfg, args.epochs))
    pyg = statistics.median(pyg_epoch_times(graph, cfg, args.epochs))
    print(f"graph: {graph.num_nodes:,} vertices, {graph.num_edges:,} edges, {graph.num_features} features; threads {args.threads}")
    print(f"{'trainer':<22}{'median epoch s':>16}{'ratio to PyG':>14}")
    print(f"{'PyG GCNConv':<22}{pyg:>16.4f}{1.0:>14.2f}")
    print(f"{'dorylus reference':<22}{ref:>16.4f}{ref / pyg:>14.2f}")


if __name__ == "__main__":
    main()
