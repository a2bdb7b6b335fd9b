"""A server process around its :class:`~dorylus_py.serving.node.ServerNode`: job after job (handshake,
heartbeat, build the role's server, run it until stop), its ``python -m`` entry point, and one-line
errors with the exit codes the driver and the supervisors read (2: refused, 4: stuck, 130: interrupted)."""

from __future__ import annotations

import itertools
import logging
import os
import signal
import sys

from dorylus_py.errors import ConfigError, DorylusError
from dorylus_py.jobkey import load_job_key
from dorylus_py.protocol import ProtocolError
from dorylus_py.protocol.transport import Curve
from dorylus_py.serving.heartbeat import Heartbeat
from dorylus_py.serving.node import PeerStuck, ServerNode, Stopped

log = logging.getLogger("dorylus_py.serving.node")


def use_huge_pages() -> None:
    """Back torch's tensors of 2 MB and more with transparent huge pages, unless the environment says
    otherwise (``THP_MEM_ALLOC_ENABLE=0``). Servers allocate and free tensors of tens of MB each task;
    with 4 KB pages the kernel zeroes every page on first touch: GAT on the 200 k graph (`cpu`, K = 2)
    spent as much time in the kernel as in torch (14 M page faults in 3 epochs; 6.9 M with huge pages,
    epoch 7.1 -> 5.7-6.0 s). Emulated Lambdas inherit it with the environment."""
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def serve(role: str, build, driver: str, rank: int, host: str = "127.0.0.1", port: int = 0,
          bind_host: str | None = None, key: bytes | None = None, curve: Curve | None = None,
          jobs: int | None = 1) -> None:
    """Run one server for ``jobs`` jobs (None: job after job until SIGTERM or Ctrl-C): for each, connect
    to the driver, get ``start`` (the job spec, and for a weight server the state to restore), build
    the server with ``build(node, start)`` and run it until the driver says stop. ``key``: the job key
    (default: from the environment, ``jobkey.py``)."""
    use_huge_pages()
    node = ServerNode(role, rank, driver, key or load_job_key(), host, port, bind_host, curve)
    if jobs is None:  # a service: `systemctl stop` (SIGTERM) ends it as Ctrl-C would
        signal.signal(signal.SIGTERM, _interrupted)
    try:
        for n in itertools.count() if jobs is None else range(jobs):
            if n:
                node.new_job()
            _one_job(node, build, None if jobs is None else 120.0)
    finally:
        node.close()


def _interrupted(*_) -> None:
    raise KeyboardInterrupt


def _one_job(node: ServerNode, build, timeout_s: float | None) -> None:
    server = heartbeat = None
    try:
        start = node.handshake(timeout_s)
        heartbeat = Heartbeat(node)
        server = build(node, start)
        server.run()
    except Stopped:
        pass
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        if server is not None and hasattr(server, "close"):
            server.close()
        log.info("%s %d: job over", node.role, node.rank)


MODULES = {"graph-server": "graph_servers", "weight-server": "dorylus_py.weights"}  # each role's `python -m`


def serve_process(role: str, build, argv=None) -> int:
    """``python -m`` entry point of a server process: started by the driver of a one-machine job
    (``--driver ADDRESS --rank K``), or on a machine of a multi-machine job (``--cluster FILE --rank K``,
    which ``dorylus graph-server`` and ``dorylus weight-server`` exec)."""
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {MODULES[role]}",
                                 description=f"dorylus {role} (started by the driver, or by `dorylus {role}`)")
    where = ap.add_mutually_exclusive_group(required=True)
    where.add_argument("--driver", help="driver address, tcp://HOST:PORT (a job's driver started this process)")
    where.add_argument("--cluster", metavar="FILE", help="cluster file: the driver's and every server's address")
    ap.add_argument("--rank", type=int, required=True, help="this server's index")
    ap.add_argument("--host", default="127.0.0.1", help="with --driver: address to bind and advertise (default 127.0.0.1)")
    ap.add_argument("--port", type=int, default=0, help="with --driver: port to bind (default: any free port)")
    ap.add_argument("--bind", default="", help="with --cluster: interface to listen on (default: the host of this "
                    "server's address in the file)")
    ap.add_argument("--jobs", type=int, default=0, help="with --cluster: jobs to serve, then exit (0: until stopped)")
    args = ap.parse_args(argv)  # the job key comes in the environment (DORYLUS_KEY), never on the command line
    if args.cluster:
        return run_main(lambda: serve_cluster(role, build, args.cluster, args.rank, args.bind, args.jobs))
    return run_main(lambda: serve(role, build, args.driver, args.rank, args.host, args.port))


def serve_cluster(role: str, build, cluster_file: str, rank: int, bind: str = "", jobs: int = 0) -> None:
    """Serve as ``role`` ``rank`` of a cluster file: job after job (``jobs`` 0) until SIGTERM or Ctrl-C,
    as a service; the job key from the environment or the Secrets Manager secret the file names."""
    from dorylus_py.serving.cluster_spec import ClusterSpec, cluster_curve

    if jobs < 0:
        raise ConfigError(f"--jobs must be 0 (until stopped) or more, got {jobs}")
    cluster = ClusterSpec.load(cluster_file)
    host, port = ClusterSpec.host_port(cluster.address(role, rank))
    key = load_job_key(cluster.key_secret, cluster.region)
    try:
        serve(role, build, cluster.driver, rank, host, port, bind_host=bind or None, key=key,
              curve=cluster_curve(cluster, key), jobs=jobs or None)
    except KeyboardInterrupt:
        pass


def exit_process(code: int) -> None:
    """End a server process with ``code`` without the interpreter's finalization. Its tensor threads are
    daemons (``platforms/inproc.py``) and may be inside a torch kernel when the last job ends (a task of an
    interrupted job); finalizing would destroy torch's thread pools under them, and the C++ runtime
    aborts ("terminate called without an active exception", SIGABRT; once in ten two-job runs). Nothing is
    lost: a job's record and checkpoints are written before its end, and the logs are flushed here."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_main(main) -> int:
    """Entry-point wrapper for server processes: one-line errors, exit 2; clean exit on stop."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr)
    logging.getLogger("dorylus").setLevel(logging.INFO)  # each server's start and end lines
    try:
        main()
    except Stopped:
        return 0
    except PeerStuck as e:  # a peer's fault, not this job's: the driver restarts the job
        print(f"error: {e}", file=sys.stderr)
        return 4
    except (DorylusError, ProtocolError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
