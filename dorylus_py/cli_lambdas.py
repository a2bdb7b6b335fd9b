"""`dorylus train`'s Lambda pool flags: how many tensor workers run at once (a number, or ``auto``
within bounds), and the emulated workers' network links. Only the standard library is imported, like
the CLI's: the parser stays fast."""

from __future__ import annotations

import argparse


def count_or_auto(value: str) -> int | str:
    """``--lambdas``, ``--chunks``: a count, or ``auto``."""
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or auto, got {value!r}") from None


def add_lambda_pool(parser: argparse.ArgumentParser, d) -> None:
    """The flags, with ``d`` (a default ``TrainConfig``) giving their defaults."""
    g = parser.add_argument_group("Lambda pool (--backend local or lambda)")
    g.add_argument("--lambdas", type=count_or_auto, default=d.lambdas, metavar="N|auto",
                   help=f"tensor workers (emulated Lambdas, or concurrent AWS invocations) at once in all, shared "
                        f"out among the graph servers (default {d.lambdas}); auto: each graph server sizes its pool "
                        "as the run goes, growing while tasks wait for a worker and its graph stages idle (keeping "
                        "a growth only if it raised throughput) and shrinking while workers idle; each decision "
                        "is in the server log and tasks.jsonl (kind resize)")
    g.add_argument("--lambdas-min", type=int, default=d.lambdas_min, metavar="N",
                   help=f"--lambdas auto: fewest workers in all, where each pool starts (default {d.lambdas_min})")
    g.add_argument("--lambdas-max", type=int, default=d.lambdas_max, metavar="N",
                   help=f"--lambdas auto: most workers in all (default {d.lambdas_max})")
    g.add_argument("--lambda-bandwidth-mbps", type=float, default=d.lambda_bandwidth_mbps, metavar="MBPS",
                   help="local: cap each emulated Lambda's transfers at this rate, each way (the Dorylus paper "
                        "measured about 200 between a Lambda and an EC2 server; default 0: unlimited)")
    g.add_argument("--row-cache-mb", type=int, default=d.row_cache_mb, metavar="MB",
                   help="each warm tensor worker keeps the input-feature rows it pulled (the only rows that never "
                        "change in training, and the widest), up to this many MB (once full it keeps what it holds); the "
                        "graph server then does not send them to it again (default: a quarter of "
                        "--lambda-memory-mb; 0: off; the cpu and gpu backends never cache)")
    g.add_argument("--stream-rows", type=int, default=d.stream_rows, metavar="ROWS",
                   help="stream each row-wise tensor task (GCN and GraphSAGE) in blocks of this many rows: the worker "
                        "asks for every block at once, computes on each as it arrives and sends its rows of the "
                        "result back at once, so its downloads, compute and uploads overlap; the graph server "
                        "takes the result only when the last message is in (default 0: whole chunks)")
