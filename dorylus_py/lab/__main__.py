"""``python -m dorylus_py.lab``: a multi-machine job on this machine (run as root; docs/lab.md).

``run --data PREPARED --out RUN_DIR [--backend lambda|cpu|local] [--shape dorylus] [--link A:B:RATE:DELAY:LOSS]...
[--no-curve] [-- TRAIN FLAGS]``: makes the hosts (a: the driver and the weight server; b, c, ...: a graph
server each; then the Lambda host for ``--backend lambda``), the keys and the cluster file, starts the
servers, runs ``dorylus train --cluster`` on host a, and takes everything down again, also on Ctrl-C
or failure. ``clean``: removes what a killed run left behind.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from dorylus_py.errors import DorylusError


def dorylus_links(placement) -> list:
    """The network Dorylus measured: Lambda <-> server 200 Mbit/s, 1 ms; server <-> server 10 Gbit/s, 0.1 ms."""
    from itertools import combinations

    from dorylus_py.lab.shaping import Link

    servers = list(dict.fromkeys([*placement.weight_servers, *placement.graph_servers]))
    links = [Link(x, y, 10_000, 0.1) for x, y in combinations(servers, 2)]
    if placement.lambda_service:
        links += [Link(placement.lambda_service, s, 200, 1) for s in servers]
    return links


def run(args) -> int:
    from dorylus_py.lab.cluster import LabCluster, Placement
    from dorylus_py.lab.lambda_service import Function
    from dorylus_py.lab.shaping import Link
    from dorylus_py.partition import PartitionStore

    parts = PartitionStore.open(args.data).num_parts
    placement = Placement.standard(parts, lambda_service=args.backend == "lambda")
    links = (dorylus_links(placement) if args.shape == "dorylus" else []) + [Link.parse(x) for x in args.link]
    for link in links:
        link.check(placement.hosts())
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dorylus-lab-"))
    flags = args.train[1:] if args.train[:1] == ["--"] else args.train
    with LabCluster(workdir, placement, links, curve=not args.no_curve,
                    function=Function(concurrency=args.lambda_concurrency)) as lab:
        for host in lab.net.hosts:
            roles = [r for r, h in placement.roles().items() if h == host] + ["driver"] * (host == placement.driver)
            print(f"host {host} {lab.net.ips[host]}: {', '.join(roles)}", flush=True)
        if any(link.delay_ms for link in links) and not lab.net.netem:
            print("note: this kernel has no sch_netem: links are shaped in rate and loss, not delayed", flush=True)
        backend = lab.lambda_flags() if args.backend == "lambda" else ["--backend", args.backend]
        code = lab.train(args.data, args.out, [*backend, *flags], timeout_s=args.timeout_s, stdout=None)
        print(f"logs and keys in {workdir}", flush=True)
    return code


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dorylus_py.lab", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a job on lab hosts, then take them down")
    r.add_argument("--data", required=True, help="a prepared store (dorylus prepare): one graph server per partition")
    r.add_argument("--out", required=True, help="the run record's folder")
    r.add_argument("--backend", choices=["lambda", "cpu", "local"], default="lambda",
                   help="lambda (default): tensor tasks on a Lambda service host of its own")
    r.add_argument("--shape", choices=["dorylus", "none"], default="dorylus",
                   help="dorylus: Lambda <-> server 200 Mbit/s 1 ms, server <-> server 10 Gbit/s 0.1 ms")
    r.add_argument("--link", action="append", default=[], metavar="A:B:RATE:DELAY:LOSS",
                   help="shape a link more (Mbit/s, ms one way, %%); repeatable")
    r.add_argument("--no-curve", action="store_true", help="plain TCP (signed, not encrypted)")
    r.add_argument("--lambda-concurrency", type=int, default=4, help="the Lambda service's workers")
    r.add_argument("--workdir", default="", help="where keys, cluster file and logs go (default: a new temp folder)")
    r.add_argument("--timeout-s", type=float, default=3600, help="give up on the job after this long")
    r.add_argument("train", nargs=argparse.REMAINDER, help="-- then flags for dorylus train (--epochs, --lambdas, ...)")
    sub.add_parser("clean", help="remove the namespaces (and processes) of lab runs that were killed")
    args = ap.parse_args(argv)
    try:
        if args.command == "clean":
            from dorylus_py.lab.network import clean_leftovers

            gone = clean_leftovers()
            print(f"removed {len(gone)} namespaces" + (f": {', '.join(gone)}" if gone else ""))
            return 0
        return run(args)
    except DorylusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; every lab host taken down", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
