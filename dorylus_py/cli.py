"""The ``dorylus`` command line.

Every subcommand validates its input before doing work; any user-caused problem is printed as one
line (``error: ...``) with exit code 2 and leaves no partial output behind.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
import time
from pathlib import Path

from dorylus_py import __version__
from dorylus_py import cli_train
from dorylus_py.errors import ConfigError, DorylusError, interrupted_by_user

DESCRIPTION = """\
dorylus-py: train graph neural networks on CPU graph servers, with dense tensor work shipped to
serverless workers (after Dorylus, OSDI 2021).

Typical flow:
  dorylus synth --out graph.npz               generate a graph (or bring your own)
  dorylus check graph.npz                     validate it and print its counts
  dorylus prepare graph.npz --partitions 4 --out parts/
  dorylus train --data parts/ --out runs/demo train, leaving a run record in runs/demo
"""

DATA_FORMATS = """\
Dataset formats (PATH):
  FILE.npz        arrays src, dst, features, labels [, train_mask, val_mask, test_mask]
  FILE (other)    text edge list 'src dst' per line, '#' comments; needs --features and --labels
  DIR/ or graph.bsnap
                  Dorylus binary files graph.bsnap, features.bsnap, labels.bsnap
  FILE.pt         a saved PyG Data object (needs torch_geometric; a pickle: trusted files only)
  DIR/            a folder made by `dorylus prepare` (the partitions are put back together)
Without split masks, a seeded random split of the labelled vertices is drawn (--train-frac, --val-frac).
"""


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="warning: %(message)s", stream=sys.stderr)
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    try:
        args = build_parser().parse_args(argv)
        args.argv = argv
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


class Parser(argparse.ArgumentParser):
    """argparse, with a usage mistake reported as one line, not the usage block."""

    def error(self, message: str):
        raise ConfigError(f"{message} (see `{self.prog} --help`)")


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


def build_parser() -> argparse.ArgumentParser:
    from dorylus_py.cli_aws import add_aws
    from dorylus_py.cli_cost import add_cost, add_report
    from dorylus_py.keys import add_keys_command

    p = Parser(prog="dorylus", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"dorylus-py {__version__}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", required=True)
    data = _data_parent()
    _add_synth(sub)
    _add_check(sub, data)
    _add_prepare(sub, data)
    _add_train(sub, data)
    add_report(sub)
    add_cost(sub)
    add_aws(sub)
    add_keys_command(sub, command)
    _add_server(sub, "graph-server", "run one graph server of a multi-machine job, from a cluster file")
    _add_server(sub, "weight-server", "run one weight server of a multi-machine job, from a cluster file")
    return p


def command(sub, name: str, help: str, parents=(), epilog: str | None = None) -> argparse.ArgumentParser:
    return sub.add_parser(
        name,
        help=help,
        description=help,
        parents=list(parents),
        epilog=epilog,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _data_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("dataset side files and split")
    g.add_argument("--features", metavar="FILE.npy", help="features (N x F) for an edge list")
    g.add_argument("--labels", metavar="FILE.npy", help="labels (N,) for an edge list; -1 = unlabelled")
    g.add_argument("--masks", metavar="FILE.npz", help="train_mask/val_mask/test_mask arrays (overrides the file's split)")
    g.add_argument("--train-frac", type=float, default=0.1, help="random split: train fraction of labelled vertices (default 0.1)")
    g.add_argument("--val-frac", type=float, default=0.1, help="random split: validation fraction; the rest is test (default 0.1)")
    g.add_argument("--split-seed", type=int, default=0, help="random split seed (default 0)")
    return p


def _sources(args):
    from dorylus_py.data import Sources

    return Sources(args.features, args.labels, args.masks, args.train_frac, args.val_frac, args.split_seed)


# --- synth -----------------------------------------------------------------------------------------


def _add_synth(sub) -> None:
    from dorylus_py.config import SynthConfig

    d = SynthConfig()
    p = command(
        sub,
        "synth",
        "generate a graph: degree-corrected stochastic block model, power-law degrees, label-correlated features",
    )
    p.add_argument("--out", required=True, metavar="FILE.npz", help="where to write the graph (npz layout)")
    p.add_argument("--nodes", type=int, default=d.nodes, help=f"vertices (default {d.nodes:,})")
    p.add_argument("--edges", type=int, default=d.edges, help=f"directed edges, both directions counted (default {d.edges:,})")
    p.add_argument("--features", type=int, default=d.features, help=f"feature dimension (default {d.features})")
    p.add_argument("--classes", type=int, default=d.classes, help=f"classes = blocks (default {d.classes})")
    p.add_argument("--homophily", type=float, default=d.homophily, help=f"chance an edge stays in its block (default {d.homophily})")
    p.add_argument("--degree-exponent", type=float, default=d.degree_exponent, help=f"power-law exponent of degrees (default {d.degree_exponent})")
    p.add_argument("--feature-signal", type=float, default=d.feature_signal, help=f"class centroid scale vs unit noise (default {d.feature_signal})")
    p.add_argument("--train-frac", type=float, default=d.train_frac, help=f"train fraction (default {d.train_frac})")
    p.add_argument("--val-frac", type=float, default=d.val_frac, help=f"validation fraction; rest is test (default {d.val_frac})")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=_run_synth)


def _config_from_args(cls, args):
    """Build a config dataclass from the parsed flags of the same names."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def _run_synth(args) -> int:
    from dorylus_py.config import SynthConfig
    from dorylus_py.data.synth import write_synth
    from dorylus_py.progress import status

    out = Path(args.out)
    _check_output_file(out, args.overwrite)
    cfg = _config_from_args(SynthConfig, args)
    cfg.check()
    t0 = time.perf_counter()
    s = write_synth(cfg, out, progress=status)
    print(
        f"wrote {out}: {s['nodes']:,} vertices, {s['edges']:,} edges, {s['features']} features, "
        f"{s['classes']} classes, split {s['train']:,}/{s['val']:,}/{s['test']:,} "
        f"({time.perf_counter() - t0:.1f} s)"
    )
    return 0


# --- check -----------------------------------------------------------------------------------------


def _add_check(sub, data) -> None:
    p = command(sub, "check", "validate a dataset and print its counts (JSON with --json)", [data], DATA_FORMATS)
    p.add_argument("path", metavar="PATH", help="dataset (see formats below)")
    p.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    p.set_defaults(run=_run_check)


def _run_check(args) -> int:
    from dorylus_py.data import load_graph

    graph = load_graph(args.path, _sources(args))
    s = graph.summary()
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{args.path}: ok")
        for k, v in s.items():
            print(f"  {k:<15} {v:,.2f}" if isinstance(v, float) else f"  {k:<15} {v:,}")
    return 0


# --- prepare ---------------------------------------------------------------------------------------


def _add_prepare(sub, data) -> None:
    p = command(
        sub,
        "prepare",
        "partition a dataset for K graph servers: per-partition Gather CSR over [local | ghost] "
        "columns, ghost maps, send lists, features, labels, masks and a checksummed manifest",
        [data],
        DATA_FORMATS + "\nAn .npz input is streamed: memory stays at a few hundred bytes per vertex whatever the\n"
        "edge count (METIS, when it is chosen, needs its own: about 200 bytes per edge).\n",
    )
    p.add_argument("input", metavar="INPUT", help="dataset (see formats below)")
    p.add_argument("--partitions", "-k", type=int, required=True, help="number of partitions (graph servers)")
    p.add_argument("--out", required=True, metavar="DIR", help="output folder, or s3://BUCKET/PREFIX (AWS credentials, "
                   "region and AWS_ENDPOINT_URL from the environment); must be empty unless --overwrite")
    p.add_argument("--partitioner", default="auto",
                   help="metis: minimum edge cut, needs memory; fennel: streaming, a few passes, bounded memory; "
                        "hash: by vertex id; auto (default): metis when its memory estimate fits --memory-budget, "
                        "else fennel (the choice is printed)")
    p.add_argument("--memory-budget", type=float, metavar="GB", help="auto: memory METIS may use (default: 3/4 of "
                   "the memory available now)")
    p.add_argument("--feature-dtype", default="float32", help="how features are stored: float32 (default), float16 "
                   "or bfloat16; graph servers compute in float32")
    p.add_argument("--scratch", metavar="DIR", help="folder for temporary files, about 16 bytes per edge "
                   "(default: beside --out)")
    p.add_argument("--seed", type=int, default=0, help="METIS / Fennel seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists (refused if its "
                   "checkpoints/ holds files, unless --delete-checkpoints)")
    p.add_argument("--delete-checkpoints", action="store_true", help="with --overwrite: delete the store's checkpoints too")
    p.set_defaults(run=_run_prepare)


def _run_prepare(args) -> int:
    from dorylus_py.partition import FEATURE_DTYPES, prepare
    from dorylus_py.partition.source import open_source
    from dorylus_py.progress import status

    if args.partitions < 1:  # checked before anything is read or created
        raise ConfigError(f"--partitions must be >= 1, got {args.partitions}")
    _check_partitioner(args.partitioner)
    if args.feature_dtype not in FEATURE_DTYPES:
        raise ConfigError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPES)}, got {args.feature_dtype!r}")
    if args.memory_budget is not None and args.memory_budget <= 0:
        raise ConfigError(f"--memory-budget must be > 0 GB, got {args.memory_budget}")
    if args.scratch and not Path(args.scratch).is_dir():
        raise ConfigError(f"{args.scratch}: --scratch is not a folder")
    if not cli_train.is_s3(args.out) and Path(args.out).exists() and not args.overwrite:
        raise DorylusError(f"{args.out}: already exists (pass --overwrite to replace it)")
    t0 = time.perf_counter()
    status(f"reading {args.input}")
    source = open_source(args.input, _sources(args))
    budget = None if args.memory_budget is None else int(args.memory_budget * 2**30)
    m = prepare(source, args.out, args.partitions, args.partitioner, args.seed, args.overwrite, progress=status,
                feature_dtype=args.feature_dtype, memory_budget=budget, scratch=args.scratch,
                delete_checkpoints=args.delete_checkpoints)
    if m["partitioner_note"]:
        print(f"partitioner auto: {m['partitioner_note']}")
    print(
        f"wrote {args.out}: {m['partitions']} partitions of {m['nodes']:,} vertices ({m['partitioner']}); "
        f"edge cut {m['edge_cut']:,} of {m['edges']:,} edges ({100 * m['edge_cut_fraction']:.1f} %, hash would cut "
        f"{100 * m['hash_edge_cut_fraction']:.1f} %); balance {m['balance']:.3f} (largest / mean); "
        f"{time.perf_counter() - t0:.1f} s"
    )
    return 0


# --- train -----------------------------------------------------------------------------------------


def _add_train(sub, data) -> None:
    from dorylus_py.cli_lambdas import add_lambda_pool, count_or_auto
    from dorylus_py.config import (
        ASYNC_CHUNKS, AUTO_CHUNK_ROWS, BACKENDS, FEATURE_NORMS, FUSE_CHOICES, MODELS, MODES, TrainConfig,
    )

    d = TrainConfig()
    p = command(
        sub,
        "train",
        "train a GNN (GCN, GAT or GraphSAGE) and write a run record (config.json, metrics.jsonl, summary.json, weights)",
        [data],
        DATA_FORMATS + "\nWithout --data, a graph is generated with `dorylus synth`'s defaults.\n",
    )
    p.add_argument("--data", metavar="PATH", help="dataset or prepared folder (default: a generated graph)")
    p.add_argument("--backend", choices=BACKENDS, default=d.backend,
                   help="reference: single-process full-batch oracle; local: graph/weight server processes with "
                        "tensor work in emulated Lambdas; lambda: the same with AWS Lambda (see docs/aws.md); cpu/gpu: the same pipeline with tensor work inside the "
                        "graph servers, on the CPU or a CUDA device (default reference)")
    p.add_argument("--out", metavar="RUN_DIR", help="run record folder (default runs/DATE-TIME-BACKEND)")
    p.add_argument("--overwrite", action="store_true", help="replace RUN_DIR if it holds a run record")
    p.add_argument("--no-data-copy", action="store_true",
                   help="keep no copy of the data in RUN_DIR: the partitions a distributed run makes when --data is "
                        "not a prepared store of K parts (RUN_DIR/partitions), gossip's graph.npz and clusters.npy, "
                        "are deleted when the run ends (so is its --resume point; pass a `dorylus prepare` store as "
                        "--data to keep both out of the record)")
    m = p.add_argument_group("model and optimiser")
    m.add_argument("--model", choices=MODELS, default=d.model,
                   help="gcn: Kipf & Welling; gat: graph attention (Velickovic et al.), attention per edge computed "
                        "in ApplyEdge tasks; sage: GraphSAGE with the mean aggregator (default gcn)")
    m.add_argument("--layers", type=int, default=d.layers, help=f"layers (default {d.layers})")
    m.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden width; for gat the width of each head (default {d.hidden})")
    m.add_argument("--dropout", type=float, default=d.dropout, help=f"dropout on each layer's input (default {d.dropout})")
    m.add_argument("--heads", type=int, default=d.heads, help=f"gat: attention heads of each hidden layer, concatenated (default {d.heads})")
    m.add_argument("--out-heads", type=int, default=d.out_heads, help=f"gat: heads of the last layer, averaged (default {d.out_heads})")
    m.add_argument("--attn-dropout", type=float, default=d.attn_dropout, metavar="P",
                   help="gat: dropout on the attention coefficients, keyed by edge (default: the same as --dropout)")
    m.add_argument("--negative-slope", type=float, default=d.negative_slope, help=f"gat: LeakyReLU slope of the attention scores (default {d.negative_slope})")
    m.add_argument("--weight-decay", type=float, default=d.weight_decay,
                   help=f"L2 weight decay: gcn on the first layer, gat and sage on every weight but the biases (default {d.weight_decay})")
    m.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    m.add_argument("--epochs", type=int, default=d.epochs, help=f"epochs (default {d.epochs})")
    m.add_argument("--seed", type=int, default=d.seed, help="weights and dropout seed (default 0)")
    m.add_argument("--feature-norm", choices=FEATURE_NORMS, default=d.feature_norm, help="row: rows sum to 1; auto (default): row when all features are >= 0")
    m.add_argument("--threads", type=int, default=d.threads, help="torch threads (default: torch's choice)")
    m.add_argument("--target-acc", type=float, default=d.target_acc, help="stop once validation accuracy reaches this")
    c = p.add_argument_group("distributed backends (local, cpu, gpu)")
    c.add_argument("--graph-servers", "-k", type=int, default=d.graph_servers, help=f"graph servers = partitions (default: the prepared store's partitions, else {d.graph_servers})")
    c.add_argument("--weight-servers", type=int, default=d.weight_servers,
                   help=f"weight servers; every weight tensor is cut into row blocks dealt over them, so M may exceed the layers (default {d.weight_servers})")
    c.add_argument("--chunks", type=count_or_auto, default=d.chunks, metavar="N|auto",
                   help="vertex intervals per graph server, each a tensor task per stage (default auto: in sync mode one "
                        "per tensor worker of a fixed --lambdas pool, and 1 on cpu/gpu, since every stage waits for all "
                        f"chunks; {ASYNC_CHUNKS} in async mode or with --lambdas auto; at most about {AUTO_CHUNK_ROWS:,} rows "
                        "each)")
    c.add_argument("--mode", choices=MODES, default=d.mode,
                   help="sync: barriers per layer, equals full-batch training (default); async: bounded staleness; "
                        "gossip / allreduce: decentralised Cluster-GCN workers (see below)")
    c.add_argument("--staleness", type=int, default=d.staleness, help=f"async: max epochs a chunk runs ahead (default {d.staleness})")
    c.add_argument("--cluster", metavar="FILE", help="multi-machine: the servers in this cluster file are started "
                   "by hand (`dorylus graph-server`/`weight-server`); --data must be a prepared folder they can read")
    c.add_argument("--switch-threshold", type=float, default=d.switch_threshold,
                   help="async: switch to sync mode once validation accuracy is within this of --target-acc, as "
                        "the original Dorylus does (default 0: never)")
    c.add_argument("--async-update", choices=("epoch", "chunk"), default=d.async_update,
                   help="async: one weight update per epoch's worth of chunk gradients, taken without a barrier "
                        "(default; Cora 81 %%), or one per chunk gradient (78 %%)")
    c.add_argument("--fuse", choices=FUSE_CHOICES, default=d.fuse,
                   help="gcn with --layers >= 2: one task per chunk computes the last layer's forward, the loss and "
                        "its gradient, and the first backward step, where unfused it takes three (forward, loss, "
                        "backward). auto (default): fused where a task saved is a round trip saved, on lambda and "
                        "on local with --lambda-latency-ms above 0; elsewhere fusing only widens the last layer's "
                        "Gather. gat, sage and a one-layer gcn always run unfused")
    c.add_argument("--no-fuse", dest="fuse", action="store_const", const="off", help="the same as --fuse off")
    c.add_argument("--remat", action="store_true",
                   help="sync: graph servers keep only what backward reads. The evaluation pass reuses the training "
                        "pass's buffers, Gather backward writes dZ over Z (dead once Gather ran), and the fused last "
                        "layer's input is recomputed from the layer below for backward instead of kept. Tasks always "
                        "recompute activations and dropout masks. Same results; a server starts an epoch once "
                        "every server finished the one before (default off)")
    c.add_argument("--partitioner", default=d.partitioner, help="auto, metis, fennel or hash: how --data is partitioned "
                   "when it is not a prepared store of --graph-servers parts (default auto; see `dorylus prepare --help`)")
    c.add_argument("--lambda-latency-ms", type=float, default=d.lambda_latency_ms, help="local: injected latency per invocation (default 0)")
    c.add_argument("--lambda-fail-rate", type=float, default=d.lambda_fail_rate, help="local: chance an invocation fails (default 0)")
    c.add_argument("--lambda-cold-start-ms", type=float, default=d.lambda_cold_start_ms,
                   help="local: the first invocation on each emulated Lambda (and on each replacement of a dead "
                        "one) waits this long, as a cold container does (default 0)")
    c.add_argument("--lambda-memory-mb", type=int, default=d.lambda_memory_mb, help=f"local: billed memory of an emulated Lambda (default {d.lambda_memory_mb}); "
                   "lambda: read from the deployed function")
    c.add_argument("--lambda-timeout-s", type=float, default=d.lambda_timeout_s, help=f"a Lambda's time limit (default {d.lambda_timeout_s:.0f})")
    c.add_argument("--lambda-function", default=d.lambda_function, help="lambda: function name or ARN (default: the cluster file's)")
    c.add_argument("--aws-region", default=d.aws_region, help="lambda: AWS region (default: from the AWS environment)")
    c.add_argument("--aws-profile", default=d.aws_profile, help="lambda: AWS credentials profile (default: from the AWS environment)")
    c.add_argument("--lambda-endpoint", default=d.lambda_endpoint, help="lambda: Lambda API endpoint URL (moto, LocalStack)")
    c.add_argument("--lambda-run-here", action="store_true",
                   help="lambda: also run each accepted invocation's handler on this machine; only for endpoints "
                        "that record invocations without running code (moto). Servers may then be local")
    c.add_argument("--tensor-threads", type=int, default=d.tensor_threads, help=f"cpu/gpu: tensor threads per graph server (default {d.tensor_threads})")
    c.add_argument("--device", default=d.device, help="cpu/gpu backends and gossip/allreduce workers: torch device "
                   "(default cuda for --backend gpu, else cpu)")
    c.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, metavar="N",
                   help="save every layer's weights and Adam state, all at the same epoch, every N epochs and at "
                        "the end, into RUN_DIR/checkpoints/; a dead server is restarted from the newest "
                        "(default 10; 0: never)")
    c.add_argument("--checkpoint-dir", default=d.checkpoint_dir, metavar="DIR",
                   help="write checkpoints here instead of RUN_DIR/checkpoints: a folder, or an s3:// prefix that "
                        "outlives the driver's machine")
    c.add_argument("--max-restarts", type=int, default=d.max_restarts,
                   help="restart the servers after one dies or goes silent at most this often, each time from "
                        f"the newest checkpoint, before the job stops with the reason (default {d.max_restarts})")
    c.add_argument("--resume", dest="resume_dir", metavar="RUN_DIR",
                   help="continue the distributed run recorded in RUN_DIR (interrupted, failed, or to go on to more "
                        "--epochs) from its newest checkpoint, in that record and with its configuration; only "
                        "--epochs, --checkpoint-every, --target-acc, --max-restarts and the wait/hang/relaunch timeouts "
                        "may change")
    c.add_argument("--relaunch-min-s", type=float, default=d.relaunch_min_s, help=f"relaunch a task after max(this, factor x average) (default {d.relaunch_min_s})")
    c.add_argument("--relaunch-factor", type=float, default=d.relaunch_factor, help=f"(default {d.relaunch_factor})")
    c.add_argument("--wait-timeout-s", type=float, default=d.wait_timeout_s, help=f"give up on any single wait after this (default {d.wait_timeout_s:.0f})")
    c.add_argument("--hang-timeout-s", type=float, default=d.hang_timeout_s,
                   help="a server whose serving loop has not turned for this long, or whose send to a peer has waited "
                        "this long, is hung: it exits and is restarted like a dead one, within --max-restarts "
                        f"(default {d.hang_timeout_s:.0f}; longer than any single step of the job)")
    c.add_argument("--replace-timeout-s", type=float, default=d.replace_timeout_s,
                   help="--cluster: when a server is lost, the others drop the job and the driver waits this long "
                        "for every server to say hello again (the lost one restarted by its supervisor or systemd), "
                        f"then resumes from the newest checkpoint, within --max-restarts (default {d.replace_timeout_s:.0f})")
    add_lambda_pool(p, d)
    g = p.add_argument_group("decentralised modes (--mode gossip | allreduce): Cluster-GCN batches on data-parallel workers")
    g.add_argument("--workers", type=int, default=d.workers, help=f"worker processes (default {d.workers}; under torchrun: its world size)")
    g.add_argument("--clusters", type=int, default=d.clusters, help=f"METIS clusters of the graph (default {d.clusters})")
    g.add_argument("--clusters-per-batch", type=int, default=d.clusters_per_batch, help=f"clusters joined into one batch (default {d.clusters_per_batch})")
    g.add_argument("--diag-lambda", type=float, default=d.diag_lambda, help=f"diagonal enhancement of the batch adjacency (default {d.diag_lambda})")
    g.add_argument("--gossip-every", type=int, default=d.gossip_every, help=f"gossip: swap parameters and the latest gradient with a random peer every k local steps (default {d.gossip_every})")
    g.add_argument("--average-every", type=int, default=d.average_every, metavar="E", help="gossip: every E epochs every worker adopts the average of all models, without stopping (default 0: never)")
    g.add_argument("--peer-timeout-s", type=float, default=d.peer_timeout_s, help=f"a worker that does not answer a peer within this is dead; its batches go to the others (default {d.peer_timeout_s:g})")
    g.add_argument("--straggler", default=d.straggler, metavar="RANK:FACTOR", help="slow worker RANK down FACTOR times (experiments)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_train)


def _run_train(args) -> int:
    from dorylus_py.config import DECENTRAL_MODES, TrainConfig
    from dorylus_py.data import SynthConfig, generate, load_graph
    from dorylus_py.progress import status
    from dorylus_py.training import RunRecord, train_reference
    from dorylus_py.training.reference import feature_norm_for, resolve_feature_norm

    given = given_flags(args.argv)
    resumed = cli_train.resume_args(args, given) if args.resume_dir else None
    cfg = _config_from_args(TrainConfig, args)
    distributed = cfg.backend != "reference" and cfg.mode not in DECENTRAL_MODES
    cluster = None
    if args.cluster:
        cfg, cluster = cli_train.with_cluster(cfg, args.cluster, given)
    elif distributed and "graph_servers" not in given and cli_train.is_prepared_store(cfg.data):
        from dorylus_py.partition import PartitionStore

        cfg = dataclasses.replace(cfg, graph_servers=PartitionStore.open(cfg.data).num_parts)
    cfg.check()
    _check_partitioner(cfg.partitioner)
    if cfg.backend == "lambda" and cluster is None and not cfg.lambda_run_here:
        raise DorylusError("--backend lambda needs --cluster FILE: Lambdas must reach the graph and weight servers at "
                           "addresses in that file (or --lambda-run-here, for tests against moto)")
    if cfg.backend == "lambda":
        cfg = cli_train.with_deployed_memory(cfg, given)
    run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.mode if cfg.mode in DECENTRAL_MODES else cfg.backend}")
    checkpoints = cli_train.checkpoints_of(cfg, run_dir)
    store, copy = (cli_train.store_for(cfg, run_dir, reuse=resumed is not None) if distributed
                   else (None, cfg.mode in DECENTRAL_MODES))  # copy: the run writes the data into its record
    done = (cli_train.checkpoint_epoch(cfg, checkpoints, None if copy else store) if resumed is not None
            else None)  # before any write
    graph = None
    if distributed and not copy:  # the graph servers read the store; the driver needs only its manifest
        from dorylus_py.partition import PartitionStore

        manifest = PartitionStore.open(store).manifest
        summary, source = manifest["summary"], cfg.data
        norm = feature_norm_for(cfg.feature_norm, manifest["features_nonnegative"], store)
    elif cfg.data is None:
        synth = SynthConfig()
        status(f"no --data: generating a graph ({synth.nodes:,} vertices, {synth.edges:,} edges, seed {synth.seed})")
        graph = generate(synth)
    else:
        status(f"loading {cfg.data}")
        graph = load_graph(cfg.data, _sources(args))
    if graph is not None:
        summary, source, norm = graph.summary(), graph.source, resolve_feature_norm(cfg, graph)
    if args.overwrite and cfg.data and not cli_train.is_s3(cfg.data) and Path(cfg.data).resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"--data {cfg.data} lies inside {run_dir}, which --overwrite would delete")
    if distributed and cfg.chunks == "auto":  # the record keeps the count the run used
        cfg = dataclasses.replace(cfg, chunks=cfg.resolved_chunks(summary["nodes"]))
        status(f"--chunks auto: {cfg.chunks} a graph server ({cfg.mode}, {cfg.backend}"
               f"{', --lambdas ' + str(cfg.lambdas) if cfg.backend in ('local', 'lambda') else ''})")
    config = cfg.to_dict() | {"feature_norm": norm, "graph": summary, "graph_source": source,
                              "sources": dataclasses.asdict(_sources(args)), "cluster": args.cluster,
                              "no_data_copy": args.no_data_copy, "store": None if copy and args.no_data_copy else store}
    if resumed is not None:  # the record's configuration, with what may change and when it was resumed
        config = resumed | {k: config[k] for k in cli_train.RESUME_OVERRIDES} | {
            "resumed_after": [*resumed.get("resumed_after", []), done]}
    try:
        if cfg.mode in DECENTRAL_MODES:
            from dorylus_py.decentral.launcher import train_decentral

            result = train_decentral(cfg, graph, run_dir, config, args.overwrite, show_progress=not args.quiet)
            if result is None:  # a torchrun rank that did not write the record (the lowest live rank does)
                return 0
            s = result.summary
            lost = s["worker_deaths"]
            print(f"{s['batches_trained']} batches trained by {s['workers']} workers ({s['batches_per_worker']} by "
                  f"rank), {s['gossip_rounds']} gossip exchanges" + (f"; lost worker(s) {lost}: the job finished with "
                                                                   f"{s['workers_at_end']} workers" if lost else ""))
        elif cfg.backend == "reference":
            record = RunRecord(run_dir, config, overwrite=args.overwrite)
            s = train_reference(graph, cfg, record, show_progress=not args.quiet).summary
        else:
            from dorylus_py.cluster.launcher import train_distributed

            record = RunRecord(run_dir, config, overwrite=args.overwrite, continue_after=done)
            status(cli_train.last_layer_note(cfg))
            if copy:
                cli_train.partition_into(cfg, graph, Path(store))
            result = train_distributed(cfg, store, record, norm, show_progress=not args.quiet, cluster=cluster,
                                       resume_from=checkpoints if resumed is not None else None,
                                       checkpoint_dir=checkpoints)
            s = record.summary or result.summary
    finally:
        if args.no_data_copy and copy:
            cli_train.drop_data_copy(run_dir)
    print(
        f"best validation accuracy {s['best_val_acc']:.4f} at epoch {s['best_epoch']}, "
        f"test accuracy there {s['test_acc_at_best_val']:.4f}; final loss {s['final_loss']:.4f}; "
        f"{s['epochs']} epochs in {s['wall_s']:.1f} s (median {1000 * s['median_epoch_s']:.1f} ms/epoch); "
        f"run record in {run_dir}"
    )
    return 0


def _add_server(sub, role: str, help: str) -> None:
    p = command(sub, role, help, epilog="The job key comes from DORYLUS_KEY (hex), or from the Secrets Manager "
                "secret the cluster file names (key_secret); the driver (`dorylus train --cluster FILE`) reads the "
                "same one. With curve_public_key in the cluster file, every connection is encrypted (CurveZMQ).")
    p.add_argument("--cluster", required=True, metavar="FILE", help="cluster file: driver, graph_servers, weight_servers addresses")
    p.add_argument("--rank", type=int, required=True, help="which graph/weight server of the file this is")
    p.add_argument("--bind", default="", help="interface to listen on (default: the host of this server's address in "
                   "the file; 0.0.0.0 for all); the file's address is what peers are told")
    p.add_argument("--jobs", type=int, default=0, help="serve this many jobs, then exit (default 0: job after job "
                   "until stopped by SIGTERM or Ctrl-C, as a service)")
    p.set_defaults(run=_run_server, role=role)


def _run_server(args) -> int:
    from dorylus_py.cluster.driver_link import cluster_curve
    from dorylus_py.cluster.node import Stopped, serve
    from dorylus_py.cluster.spec import ClusterSpec
    from dorylus_py.jobkey import load_job_key

    cluster = ClusterSpec.load(args.cluster)
    host, port = ClusterSpec.host_port(cluster.address(args.role, args.rank))
    key = load_job_key(cluster.key_secret, cluster.region)
    curve = cluster_curve(cluster, key)
    if args.role == "graph-server":
        from graph_servers.server import GraphServer as build
    else:
        from dorylus_py.weights.server import WeightServer as build
    if args.jobs < 0:
        raise ConfigError(f"--jobs must be 0 (until stopped) or more, got {args.jobs}")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stderr,
                        force=True)  # a server's log: when, and how bad
    logging.getLogger("dorylus").setLevel(logging.INFO)  # each job's start and end lines, for the operator
    try:
        serve(args.role, build, cluster.driver, args.rank, host, port, bind_host=args.bind or None, key=key, curve=curve,
              jobs=args.jobs or None)
    except (Stopped, KeyboardInterrupt):
        pass
    return 0


def _check_partitioner(name: str) -> None:
    from dorylus_py.partition.partitioners import PARTITIONERS

    if name not in PARTITIONERS:
        raise ConfigError(f"--partitioner must be one of {', '.join(PARTITIONERS)}, got {name!r}")


def _check_output_file(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise DorylusError(f"{path}: already exists (pass --overwrite to replace it)")
    if not path.parent.exists():
        raise DorylusError(f"{path.parent}: output folder does not exist")
