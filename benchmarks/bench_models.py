"""GAT and GraphSAGE: PyG's GATConv / SAGEConv against the reference trainer and the distributed runtime,
in one run, on the same graph and cores.

Graph: synthetic, 200 k vertices, 4 M edges, 128 features, 10 classes. GAT: 2 layers, 8 heads x 8
hidden (the paper's Cora setting), 1 output head, dropout 0.6 on inputs and attention; GraphSAGE: 2
layers, 16 hidden, mean aggregator, dropout 0.5. An epoch is a training step plus an evaluation
forward, for every trainer. PyG and the reference trainer run in one process, an epoch of each in turn (so a change in the
machine's load hits both alike); the distributed runs follow, each in its own processes, with peak RSS
sampled per process. Rows per model: PyG; the reference trainer; `cpu` K=2 sync; `local` K=2 sync
(4 emulated Lambdas).
Target on 2 cores: GAT reference and `cpu` K=2 at most 0.7x PyG GATConv.

    python benchmarks/bench_models.py [--models gat,sage --nodes 200000 --edges 4000000 --epochs 4]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_runtime import run_measured, synth_parts  # noqa: E402

from dorylus_py import children  # noqa: E402

SETTINGS = {  # the flags of `dorylus train` for each model
    "gat": ["--model", "gat", "--heads", "8", "--hidden", "8", "--out-heads", "1", "--dropout", "0.6", "--lr", "0.005"],
    "sage": ["--model", "sage", "--hidden", "16", "--dropout", "0.5"],
}


def single_process(model: str, data: str, epochs: int, threads: int) -> dict[str, list[float]]:
    """Runs in a subprocess: epoch times of PyG and of the reference trainer, one epoch of each in turn, so
    that a change in the machine's load hits both alike (each reference epoch is a fresh one-epoch run:
    its setup is not timed)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv, SAGEConv

    from dorylus_py.cli import build_parser
    from dorylus_py.config import SECTION_OF, TrainConfig
    from dorylus_py.data import load_graph
    from dorylus_py.training import train_reference

    torch.set_num_threads(threads)
    graph = load_graph(data)
    src, dst = graph.edges()
    ei = torch.from_numpy(np.stack([src, dst]))
    x, y = torch.from_numpy(graph.features), torch.from_numpy(graph.labels)
    train = torch.from_numpy(graph.train_mask).nonzero().squeeze(1)
    f, c = graph.num_features, graph.num_classes
    if model == "gat":
        convs = torch.nn.ModuleList([GATConv(f, 8, heads=8, dropout=0.6), GATConv(64, c, heads=1, concat=False, dropout=0.6)])
        act, p = F.elu, 0.6
    else:
        convs = torch.nn.ModuleList([SAGEConv(f, 16), SAGEConv(16, c)])
        act, p = F.relu, 0.5

    def forward(training: bool):
        h = x
        for i, conv in enumerate(convs):
            h = conv(F.dropout(act(h) if i else h, p, training), ei)
        return h

    opt = torch.optim.Adam(convs.parameters(), lr=0.005)
    flags = vars(build_parser().parse_args(["train", *SETTINGS[model]]))
    cfg = TrainConfig(**{k: v for k, v in flags.items() if k in SECTION_OF}
                      | dict(epochs=1, threads=threads, feature_norm="none"))
    times: dict[str, list[float]] = {"pyg": [], "reference": []}
    for epoch in range(epochs):
        t0 = time.perf_counter()
        convs.train()
        opt.zero_grad()
        F.cross_entropy(forward(True)[train], y[train]).backward()
        opt.step()
        convs.eval()
        with torch.no_grad():
            forward(False)
        times["pyg"].append(time.perf_counter() - t0)
        times["reference"].append(train_reference(graph, cfg, show_progress=False).history[0]["epoch_s"])
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gat,sage")
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=4_000_000)
    ap.add_argument("--epochs", type=int, default=4, help="epochs per trainer; the first is not counted (default 4)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4, help="chunks per graph server (default 4, as the README's tables were "
                    "measured; `dorylus train` picks its own with --chunks auto)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(single_process(args.model, args.data, args.epochs, args.threads)))
        return

    tmp = Path(tempfile.mkdtemp(prefix="dorylus-bench-"))
    py = children.python()
    graph, parts = synth_parts(tmp, args.nodes, args.edges)
    print(f"graph: {args.nodes:,} vertices, {args.edges:,} edges, 128 features; {args.threads} threads; epoch = "
          f"training step + evaluation forward; median of epochs 2..{args.epochs}; {args.chunks} chunks per graph server")
    for model in args.models.split(","):
        out, peaks = run_measured([*py, __file__, "--worker", "--model", model, "--data", str(graph), "--epochs",
                                   str(args.epochs), "--threads", str(args.threads)])
        times = json.loads(out)
        rows = [(f"PyG {'GATConv' if model == 'gat' else 'SAGEConv'}", statistics.median(times["pyg"][1:]), {}),
                ("reference", statistics.median(times["reference"][1:]), {})]
        rows[0][2]["PyG + reference"] = peaks["driver"]
        for name, backend in (("cpu K=2 sync", "cpu"), ("local K=2 sync", "local")):
            run_dir = tmp / f"{model}-{backend}"
            _, peaks = run_measured([*py, "-m", "dorylus_py", "train", "--data", str(parts), "--out", str(run_dir),
                                     "--epochs", str(args.epochs), "--quiet", "--feature-norm", "none", "-k", "2",
                                     "--lambdas", "4", "--chunks", str(args.chunks), "--backend", backend,
                                     *SETTINGS[model]])
            metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
            rows.append((name, statistics.median(m["epoch_s"] for m in metrics[1:]), peaks))
        pyg = rows[0][1]
        print(f"\n{model}: {' '.join(SETTINGS[model])}")
        print(f"{'trainer':<20}{'epoch s':>9}{'x PyG':>8}  peak RSS MiB per process")
        for name, sec, peaks in rows:
            rss = ", ".join(f"{role} {mib:,.0f}" for role, mib in sorted(peaks.items()))
            print(f"{name:<20}{sec:>9.3f}{sec / pyg:>8.2f}  {rss}", flush=True)


if __name__ == "__main__":
    main()
