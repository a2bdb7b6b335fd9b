"""What this box charges for the same work at a smaller share of a core: the part of a scale model's
error that is the machine's, not the model's (docs/lab.md, "Measured error").

A scale model gives a host of C cores C/D of a core (a CFS quota) and assumes that a CPU second buys the
same work at any D. On a VM that need not hold: a kernel whose data does not fit the core's caches, run
for 1.5 ms of every 10, can cost more CPU time per iteration than the same kernel run for 6 ms of every
10. Each kernel below (``dense``: a 256 x 256 matmul chain, cache-resident; ``sparse``: a CSR graph
product on a 10 k x 128 feature matrix then a dense layer, as a graph server's epoch does) runs in a
fresh process in a group of C / D cores for each D, interleaved ``--repeats`` times; the table gives the
median CPU milliseconds per iteration and its ratio to D = 1's. A ratio of 1 means the model's CPU
seconds are the real host's; 1.3 means a model host does 30 % less work per model second. Needs root
and cgroup v1; run on a quiet machine.

    python benchmarks/bench_host_share.py [--cores 0.6 --dilations 1,2,4 --repeats 3 --iterations 60]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess

from bench_tta import fail

from dorylus_py import children
from dorylus_py.cgroups import JobGroups, unavailable
from dorylus_py.hosts import Host
from dorylus_py.settings import finite_float

KERNEL = r"""
import sys, time, warnings
import torch
warnings.filterwarnings("ignore")
torch.set_num_threads(1)
kind, iterations = sys.argv[1], int(sys.argv[2])
g = torch.Generator().manual_seed(0)
n, nnz = 10_000, 150_000
a = torch.sparse_coo_tensor(torch.randint(0, n, (2, nnz), generator=g), torch.rand(nnz, generator=g), (n, n))
a = a.coalesce().to_sparse_csr()
x, w, d = torch.rand(n, 128, generator=g), torch.rand(128, 128, generator=g), torch.randn(256, 256, generator=g)
step = (lambda: (a @ x) @ w) if kind == "sparse" else (lambda: torch.tanh(d @ d) @ d)
for _ in range(3):
    step()
start = time.process_time()
for _ in range(iterations):
    step()
print((time.process_time() - start) / iterations * 1e3)
"""


def cpu_ms(kind: str, cores: float, dilation: float, iterations: int) -> float:
    with JobGroups(dilation) as groups:
        group = groups.add([Host("host", cores)])["host"]
        out = subprocess.run(children.python("-c", KERNEL, kind, iterations), capture_output=True, text=True,
                             preexec_fn=group.preexec(), check=True)
    return float(out.stdout)


def positive(value: str) -> float:
    """A finite number above 0 (``settings.finite_float``, then the sign)."""
    number = finite_float(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value!r}")
    return number


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.error = fail  # one line and exit 2, as the other benchmarks
    p.add_argument("--cores", type=positive, default=0.6, help="the host's cores C (default 0.6, as tests/scale_model)")
    p.add_argument("--dilations", default="1,2,4", help="comma-separated D, the first the reference (default 1,2,4)")
    p.add_argument("--repeats", type=int, default=3, help="interleaved runs per cell, the median kept (default 3)")
    p.add_argument("--iterations", type=int, default=60, help="kernel iterations per run (default 60)")
    args = p.parse_args()
    try:
        dilations = [positive(d) for d in args.dilations.split(",")]
    except argparse.ArgumentTypeError as e:
        fail(f"--dilations: {e}")
    if args.repeats < 1 or args.iterations < 1:
        fail(f"--repeats and --iterations must be at least 1, got {args.repeats} and {args.iterations}")
    if why := unavailable():
        fail(why)
    print(f"host of {args.cores:g} cores; median CPU ms per iteration of {args.repeats} runs; ratio to D={dilations[0]:g}")
    print(f"{'kernel':8s} " + " ".join(f"{'D=' + format(d, 'g') + ' (' + format(args.cores / d, '.3g') + ' core)':>22s}"
                                       for d in dilations))
    for kind in ("dense", "sparse"):
        runs: dict[float, list[float]] = {d: [] for d in dilations}
        for _ in range(args.repeats):
            for d in dilations:
                runs[d].append(cpu_ms(kind, args.cores, d, args.iterations))
        med = {d: statistics.median(v) for d, v in runs.items()}
        print(f"{kind:8s} " + " ".join(f"{med[d]:12.2f} ({med[d] / med[dilations[0]]:4.2f}x)" for d in dilations),
              flush=True)


if __name__ == "__main__":
    main()
