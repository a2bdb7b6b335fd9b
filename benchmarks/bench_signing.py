"""What signing every message costs: epoch time with and without the MAC, in one run, on the 200 k-vertex
benchmark graph of bench_runtime.py (128 features: a layer-0 task pulls 128-wide rows, so an epoch moves
about 400 MB of tensors through the codec on 2 graph servers).

Variants, each in every process of a job (the driver, servers and emulated Lambdas pick it up from a
``sitecustomize`` on PYTHONPATH, so the product code has no switch that turns signing off):
- ``signed``: the product (HMAC-SHA256 over the envelope, header and the tensors' AES-GMAC tags);
- ``unsigned``: the MAC replaced by a constant (sequence and JSON checks still run);
- ``sha256``: tensor frames under the HMAC through their SHA-256 digests instead of GMAC tags, the
  construction the issue first suggested; shows why GMAC.

Runs alternate variants, ``--repeats`` times per configuration; the table gives medians of the per-run
median epoch (epochs 2..) and the ratio to ``unsigned``, and the same ratio of the CPU seconds all the
job's processes used (start-up included, so it understates the per-epoch share; it is less disturbed
than wall time by other work on a shared machine). Also the codec alone: MB/s through encode and
decode of a 25.6 MB frame, and microseconds per small message.

    python benchmarks/bench_signing.py [--nodes 200000 --edges 4000000 --epochs 6 --repeats 2 --configs async]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from dorylus_py import children

PATCHES = {
    "unsigned": "from dorylus_py.protocol import session\nsession.Session._mac = lambda self, *args: bytes(32)\n",
    "sha256": '''import hashlib, hmac, struct
from dorylus_py.protocol import session


def _mac(self, fixed, audience, header, frames):
    parts = [fixed, session._audience(audience), struct.pack(">IH", len(header), len(frames)), header]
    parts += [struct.pack(">Q", len(f)) + hashlib.sha256(f).digest() for f in frames]
    return hmac.digest(self._key, b"".join(parts), "sha256")


session.Session._mac = _mac
''',
}
CONFIGS = [
    ("cpu K=2 sync", ["--backend", "cpu"]),
    ("local K=2 sync", ["--backend", "local", "--lambdas", "4"]),
    ("local K=2 async S=1", ["--backend", "local", "--lambdas", "4", "--mode", "async", "--staleness", "1"]),
]


def variant_env(tmp: Path, variant: str) -> dict:
    env = dict(os.environ)
    if variant in PATCHES:
        folder = tmp / f"site-{variant}"
        folder.mkdir(exist_ok=True)
        (folder / "sitecustomize.py").write_text(PATCHES[variant])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder), env.get("PYTHONPATH")) if p)
    return env


def epoch_seconds(parts: Path, run: Path, flags: list[str], epochs: int, env: dict) -> tuple[float, float]:
    """(median epoch seconds, CPU seconds of the whole job: every process, start-up included)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([*children.module("dorylus_py"), "train", "--data", str(parts), "--out", str(run), "--epochs",
                    str(epochs), "--quiet", "--feature-norm", "none", "-k", "2", "--chunks", "4", *flags],
                   check=True, capture_output=True, env=env)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(m["epoch_s"] for m in metrics[1:]), cpu


def codec_alone(variant: str) -> tuple[float, float]:
    """(MB/s through encode + decode of one 25.6 MB frame, microseconds per small round trip)."""
    import numpy as np

    if variant in PATCHES:
        exec(PATCHES[variant], {})  # noqa: S102  (the same patch the jobs get)
    from dorylus_py.protocol import Message, Session

    a, b = Session(b"k" * 32), Session(b"k" * 32)
    big = Message("rows", {}, {"P": np.ones((50_000, 128), np.float32)})
    small = Message("pull_rows", {"task": {"kind": "fwd", "train": True, "epoch": 3, "layer": 0, "chunk": 1}, "req": "r"})
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        b.decode(a.encode(big, "tcp://x:1"), "tcp://x:1")
        times.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(2000):
        b.decode(a.encode(small, "tcp://x:1"), "tcp://x:1")
    return 2 * 25.6 / min(times), (time.perf_counter() - t0) / 2000 * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--edges", type=int, default=4_000_000)
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default="unsigned,signed,sha256")
    ap.add_argument("--configs", default="", help="only the configurations whose names contain one of these "
                    "comma-separated words (cpu, sync, async); default: all")
    ap.add_argument("--codec", metavar="VARIANT", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.codec:
        print(json.dumps(codec_alone(args.codec)))
        return
    variants = args.variants.split(",")
    words = [w for w in args.configs.split(",") if w]
    configs = [(n, f) for n, f in CONFIGS if not words or any(w in n for w in words)]
    if not configs:
        ap.error(f"--configs {args.configs}: no configuration is named so ({', '.join(n for n, _ in CONFIGS)})")
    tmp = Path(tempfile.mkdtemp(prefix="dorylus-bench-signing-"))
    py = children.python()
    graph, parts = tmp / "graph.npz", tmp / "parts"
    subprocess.run([*py, "-m", "dorylus_py", "synth", "--out", graph, "--nodes", str(args.nodes), "--edges", str(args.edges),
                    "--features", "128", "--classes", "10"], check=True, capture_output=True)
    subprocess.run([*py, "-m", "dorylus_py", "prepare", graph, "-k", "2", "--out", parts], check=True, capture_output=True)
    load = [os.getloadavg()]
    codec = {v: json.loads(subprocess.run([*py, __file__, "--codec", v], check=True, capture_output=True, text=True,
                                          env=variant_env(tmp, "signed")).stdout) for v in variants}
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in range(args.repeats):
        for name, flags in configs:
            for v in (variants if r % 2 == 0 else variants[::-1]):
                run = tmp / f"{name.replace(' ', '_').replace('=', '')}-{v}-{r}"
                times.setdefault((name, v), []).append(epoch_seconds(parts, run, flags, args.epochs, variant_env(tmp, v)))
        load.append(os.getloadavg())
    print(f"graph: {args.nodes:,} vertices, {args.edges:,} edges, 128 features; K=2, 4 chunks per server; "
          f"median of epochs 2..{args.epochs}, median of {args.repeats} runs per cell")
    others = [v for v in variants if v != "unsigned"]
    print(f"{'configuration':<22}" + "".join(f"{v + ' s':>12}" for v in variants) + "".join(
        f"{v + '/unsigned':>18}" for v in others) + "".join(f"{'CPU ' + v + '/unsigned':>22}" for v in others))
    for name, _ in configs:
        med = {v: statistics.median(t for t, _ in times[(name, v)]) for v in variants}
        cpu = {v: statistics.median(c for _, c in times[(name, v)]) for v in variants}
        print(f"{name:<22}" + "".join(f"{med[v]:>12.3f}" for v in variants)
              + "".join(f"{med[v] / med['unsigned']:>18.3f}" for v in others)
              + "".join(f"{cpu[v] / cpu['unsigned']:>22.3f}" for v in others))
    for v in variants:
        mbs, us = codec[v]
        print(f"codec {v:<9}: {mbs:,.0f} MB/s through encode + decode of a 25.6 MB frame; {us:.0f} us per small round trip")
    print("load average (1, 5, 15 min) before and after each round: " + "; ".join(
        ", ".join(f"{x:.1f}" for x in la) for la in load))


if __name__ == "__main__":
    main()
