"""GPU check: the decentralised modes and the pipeline's `gpu` backend on one CUDA device, in minutes.

Runs, on one synthetic graph: `--mode gossip` and `--mode allreduce` with 2 workers sharing the GPU
(gloo between them: NCCL wants one GPU per rank), and `--backend gpu` with 2 graph servers; prints
median epoch time, best validation accuracy and test accuracy there for each. Sized to finish in
under 5 minutes on one GPU. It cannot run in CI; `--device cpu` smoke-tests the script anywhere.

    python benchmarks/gpu_check.py [--nodes 100000 --edges 2000000 --epochs 30 --device cuda]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def dorylus(*args: str) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "dorylus_py", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        sys.exit(f"failed: dorylus {' '.join(args)}\n{proc.stderr.strip()[-2000:]}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000)
    ap.add_argument("--edges", type=int, default=2_000_000)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible to torch (use --device cpu to smoke-test the script)")
        print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        graph = tmp / "g.npz"
        dorylus("synth", "--out", str(graph), "--nodes", str(args.nodes), "--edges", str(args.edges),
                "--homophily", "0.5", "--feature-signal", "0.15")
        common = ["--data", str(graph), "--epochs", str(args.epochs), "--device", args.device, "--quiet"]
        runs = {
            "gossip, 2 workers": ["--mode", "gossip", "--workers", "2", "--clusters", "80"],
            "allreduce, 2 workers": ["--mode", "allreduce", "--workers", "2", "--clusters", "80"],
            "pipeline gpu, K=2 sync": ["--backend", "gpu", "--graph-servers", "2", "--chunks", "2"],
        }
        print(f"graph: {args.nodes:,} vertices, {args.edges:,} edges, 128 features; {args.epochs} epochs")
        print(f"{'run':<26}{'epoch ms':>10}{'best val':>10}{'test@best':>11}{'total s':>9}")
        for name, flags in runs.items():
            out = tmp / name.replace(" ", "_").replace(",", "")
            total = dorylus("train", *common, *flags, "--out", str(out))
            s = json.loads((out / "summary.json").read_text())
            print(f"{name:<26}{1000 * s['median_epoch_s']:>10.1f}{s['best_val_acc']:>10.4f}"
                  f"{s['test_acc_at_best_val']:>11.4f}{total:>9.1f}")


if __name__ == "__main__":
    main()
