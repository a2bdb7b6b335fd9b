"""The ``dorylus`` command line.

Every subcommand validates its input before doing work; any user-caused problem is printed as one
line (``error: ...``) with exit code 2 and leaves no partial output behind.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from dorylus_py import __version__
from dorylus_py.cli_parser import Parser, command
from dorylus_py.errors import DorylusError, interrupted_by_user
from dorylus_py.spelling import speaking_flags

DESCRIPTION = """\
dorylus-py: train graph neural networks on CPU graph servers, with dense tensor work shipped to
serverless workers (after Dorylus, OSDI 2021).

Typical flow:
  dorylus synth --out graph.npz               generate a graph (or bring your own, or use the
                                              shipped cora or citeseer by name: `dorylus check cora`)
  dorylus check graph.npz                     validate it and print its counts
  dorylus prepare graph.npz --partitions 4 --out parts/
  dorylus train --data parts/ --out runs/demo train, leaving a run record in runs/demo
  dorylus predict runs/demo --out pred.npy    class probabilities for every vertex
  dorylus export runs/demo model.pt --to pyg  the model for torch_geometric's convs
"""


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    try:
        with speaking_flags():  # its errors name flags, not the Python API's settings
            args = build_parser().parse_args(argv)
            args.given = given_flags(argv)
            return args.run(args) or 0
    except DorylusError as e:
        _wind_up(e)
        print(f"error: {e}", file=sys.stderr)
        return 130 if interrupted_by_user(e) else 2
    except KeyboardInterrupt as e:
        where = _wind_up(e)
        print("error: interrupted" + (f"; run record so far in {where[-1]}" if where else ""), file=sys.stderr)
        return 130
    except Exception as e:  # a bug: the run record says how it ended, the traceback says where
        _wind_up(e)
        raise


def _wind_up(error: BaseException) -> list[Path]:
    """Before the error line: close progress bars, end unfinished run records (``summary.json`` with
    status ``interrupted`` or ``failed: ...``); return those records' folders. Modules not loaded yet
    had no bar or record open."""
    progress, record = sys.modules.get("dorylus_py.progress"), sys.modules.get("dorylus_py.training.record")
    if progress is not None:
        progress.close_bars()
    return record.abort_unfinished(record.end_status(error)) if record is not None else []


def build_parser() -> argparse.ArgumentParser:
    from dorylus_py.cli_aws import add_aws
    from dorylus_py.cli_cost import add_cost, add_report
    from dorylus_py.cli_data import add_check, add_prepare, add_synth, data_parent
    from dorylus_py.cli_train import add_train
    from dorylus_py.cli_use import add_export, add_predict
    from dorylus_py.keygen import add_keys_command

    p = Parser(prog="dorylus", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dorylus-py {__version__}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", required=True)
    data = data_parent()
    add_synth(sub)
    add_check(sub, data)
    add_prepare(sub, data)
    add_train(sub, data)
    add_predict(sub, data)
    add_export(sub)
    add_report(sub)
    add_cost(sub)
    add_aws(sub)
    add_keys_command(sub, command)
    _add_server(sub, "graph-server", "run one graph server of a multi-machine job, from a cluster file")
    _add_server(sub, "weight-server", "run one weight server of a multi-machine job, from a cluster file")
    return p


def given_flags(argv: list[str]) -> set[str]:
    """The ``dest`` of every option given on the command line ``argv``, as opposed to defaulted."""
    parser = build_parser()
    todo, options = [parser], set()
    while todo:
        for action in todo.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                todo.extend(action.choices.values())
            elif action.option_strings:
                options.add(action.dest)
            action.default = argparse.SUPPRESS
    return set(vars(parser.parse_args(argv))) & options


def _add_server(sub, role: str, help: str) -> None:
    p = command(sub, role, help, epilog="The job key comes from DORYLUS_KEY (hex), or from the Secrets Manager "
                "secret the cluster file names (key_secret); the driver (`dorylus train --cluster FILE`) reads the "
                "same one. With curve_public_key in the cluster file, every connection is encrypted (CurveZMQ); without it, "
                "only a client showing the job key's PLAIN password gets through the handshake (not encrypted).")
    p.add_argument("--cluster", required=True, metavar="FILE", help="cluster file: driver, graph_servers, weight_servers addresses")
    p.add_argument("--rank", type=int, required=True, help="which graph/weight server of the file this is")
    p.add_argument("--bind", default="", help="interface to listen on (default: the host of this server's address in "
                   "the file; 0.0.0.0 for all); the file's address is what peers are told")
    p.add_argument("--jobs", type=int, default=0, help="serve this many jobs, then exit (default 0: job after job "
                   "until stopped by SIGTERM or Ctrl-C, as a service)")
    p.set_defaults(run=_run_server, role=role)


def _run_server(args) -> int:
    """The role's own process takes over this one (``exec``: the same pid, for systemd and supervisors):
    the deployable units are started, never imported, by the library."""
    from dorylus_py import children
    from dorylus_py.serving.process import MODULES

    argv = ["--cluster", args.cluster, "--rank", str(args.rank), "--jobs", str(args.jobs)] + (["--bind", args.bind] if args.bind else [])
    sys.stdout.flush()
    sys.stderr.flush()
    child = children.module(MODULES[args.role], *argv)  # -P: nothing of the working folder runs in the server
    os.execve(child[0], child, children.env())
