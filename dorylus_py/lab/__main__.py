"""``python -m dorylus_py.lab``: a multi-machine job on this machine (run as root; docs/lab.md).

``run --data PREPARED --out RUN_DIR [--backend lambda|cpu|local] [--shape dorylus] [--link A:B:RATE:DELAY:LOSS]...
[--no-curve] [--dilation D --host-cpus C [--lambda-vcpus V] [--host-memory-mb MB]] [-- TRAIN FLAGS]``: makes the hosts (a: the driver and the weight server; b, c, ...: a graph
server each; then the Lambda host for ``--backend lambda``), the keys and the cluster file, starts the
servers, runs ``dorylus train --cluster`` on host a, and takes everything down again, also on Ctrl-C
or failure. ``clean``: removes what a killed run left behind.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

from dorylus_py.errors import DorylusError

SERVICE_CPUS = 0.25  # the Lambda service's front end (HTTP, dispatch): its Lambdas are hosts of their own
LAMBDA_MEMORY_MB = 3008  # the lab's function (lambda_service.Function)


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
    flags = args.train[1:] if args.train[:1] == ["--"] else args.train
    hosts = scale_hosts(args, placement)  # before anything is made: a model that cannot run says so
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dorylus-lab-"))
    with ExitStack() as stack:
        groups = stack.enter_context(host_groups(args, hosts))
        flags += scale_flags(args)
        lab = stack.enter_context(LabCluster(workdir, placement, [x.dilated(args.dilation) for x in links],
                                             curve=not args.no_curve, groups=groups,
                                             function=Function(concurrency=args.lambda_concurrency)))
        if hosts:
            print(f"scale model: D {args.dilation:g}; " + ", ".join(f"{h.name} {h.cores:g} cores" for h in hosts)
                  + f" (this box: {sum(h.cores for h in hosts) / args.dilation:.2f} cores)", flush=True)
        for host in lab.net.hosts:
            roles = [r for r, h in placement.roles().items() if h == host] + ["driver"] * (host == placement.driver)
            print(f"host {host} {lab.net.ips[host]}: {', '.join(roles)}", flush=True)
        if any(link.delay_ms for link in links) and not lab.net.netem:
            print("note: this kernel has no sch_netem: links are shaped in rate and loss, not delayed", flush=True)
        backend = lab.lambda_flags() if args.backend == "lambda" else ["--backend", args.backend]
        code = lab.train(args.data, args.out, [*backend, *flags], timeout_s=args.timeout_s, stdout=None)
        print(f"logs and keys in {workdir}", flush=True)
    return code


def scale_hosts(args, placement) -> list:
    """The lab's hosts as a scale model (none without --host-cpus): each graph-server host C cores, host a
    (driver and weight server) --weight-host-cpus, the Lambda service's host SERVICE_CPUS for its front end
    and V for each of its --lambda-concurrency Lambdas, which share that host's group (``ip netns exec``
    mounts a /sys of the host's own, without the cgroup files, so a process there cannot make a group of
    its own); refused where they do not fit this box."""
    from dorylus_py.hosts import Host, box_cores, check_fit, lambda_vcpus
    from dorylus_py.timescale import check_dilation

    check_dilation(args.dilation)
    if not args.host_cpus:
        if args.dilation != 1.0:
            raise DorylusError("--dilation needs --host-cpus: without CPU groups nothing runs D times slower")
        return []
    from dorylus_py.cgroups import unavailable

    if why := unavailable():
        raise DorylusError(why)
    mb = args.host_memory_mb
    cores = {h: args.host_cpus for h in placement.graph_servers}
    cores[placement.driver] = args.weight_host_cpus or args.host_cpus
    if placement.lambda_service:  # its Lambdas' cores together (a process on a lab host cannot make a group)
        v = lambda_vcpus(LAMBDA_MEMORY_MB, args.lambda_vcpus)
        cores[placement.lambda_service] = SERVICE_CPUS + args.lambda_concurrency * v
    hosts = [Host(h, cores[h], mb) for h in placement.hosts()]
    check_fit(hosts, args.dilation, box_cores())
    return hosts


@contextmanager
def host_groups(args, hosts):
    """Each lab host's CPU group, and D in the environment every host's processes get; all removed at
    the end."""
    from dorylus_py.cgroups import JobGroups
    from dorylus_py.timescale import ENV

    if not hosts:
        yield {}
        return
    saved = os.environ.get(ENV)
    with JobGroups(args.dilation) as jobs:
        groups = jobs.add(hosts)
        os.environ[ENV] = repr(args.dilation)
        try:
            yield groups
        finally:
            os.environ.pop(ENV, None) if saved is None else os.environ.__setitem__(ENV, saved)


def scale_flags(args) -> list[str]:
    """What the driver records of the model (config.json): D and each host's cores."""
    if not args.host_cpus:
        return []
    return ["--dilation", str(args.dilation), "--host-cpus", str(args.host_cpus), "--weight-host-cpus",
            str(args.weight_host_cpus), "--lambda-vcpus", str(args.lambda_vcpus), "--host-memory-mb",
            str(args.host_memory_mb)]


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
    r.add_argument("--no-curve", action="store_true",
                   help="no CurveZMQ: only the PLAIN gate of the job key admits; signed, not encrypted")
    r.add_argument("--lambda-concurrency", type=int, default=4, help="the Lambda service's workers")
    r.add_argument("--workdir", default="", help="where keys, cluster file and logs go (default: a new temp folder)")
    r.add_argument("--timeout-s", type=float, default=3600, help="give up on the job after this long")
    r.add_argument("--dilation", type=float, default=1.0, metavar="D",
                   help="a scale model (docs/lab.md): each host gets C/D cores; link rates / D, delays and every "
                        "timeout x D; the record's model times are raw / D (needs --host-cpus)")
    r.add_argument("--host-cpus", type=float, default=0.0, metavar="C",
                   help="each graph-server host's cores (a cgroup; default 0: hosts share the box's cores)")
    r.add_argument("--weight-host-cpus", type=float, default=0.0, metavar="C",
                   help="host a's (driver and weight server) cores (default: --host-cpus)")
    r.add_argument("--lambda-vcpus", type=float, default=0.0, metavar="V",
                   help="each Lambda's cores, a host of its own (default: what AWS gives the function's memory, "
                        "1,769 MB a vCPU)")
    r.add_argument("--host-memory-mb", type=int, default=0, metavar="MB",
                   help="each host's memory limit: one out of memory is killed and its supervisor restarts it")
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
