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
from dorylus_py.errors import DorylusError

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
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.run(args) or 0
    except DorylusError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dorylus", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"dorylus-py {__version__}")
    sub = p.add_subparsers(title="commands", metavar="COMMAND", required=True)
    data = _data_parent()
    _add_synth(sub)
    _add_check(sub, data)
    _add_prepare(sub, data)
    _add_train(sub, data)
    _add_report(sub)
    _add_cost(sub)
    _add_aws(sub)
    _add_server(sub, "graph-server", "run one graph server of a multi-machine job, from a cluster file")
    _add_server(sub, "weight-server", "run one weight server of a multi-machine job, from a cluster file")
    return p


def _command(sub, name: str, help: str, parents=(), epilog: str | None = None) -> argparse.ArgumentParser:
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
    from dorylus_py.data.synth import SynthConfig

    d = SynthConfig()
    p = _command(
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
    from dorylus_py.data.synth import SynthConfig, write_synth
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
    p = _command(sub, "check", "validate a dataset and print its counts (JSON with --json)", [data], DATA_FORMATS)
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
    from dorylus_py.partition import FEATURE_DTYPES, PARTITIONERS

    p = _command(
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
    p.add_argument("--partitioner", choices=PARTITIONERS, default="auto",
                   help="metis: minimum edge cut, needs memory; fennel: streaming, a few passes, bounded memory; "
                        "hash: by vertex id; auto (default): metis when its memory estimate fits --memory-budget, "
                        "else fennel (the choice is printed)")
    p.add_argument("--memory-budget", type=float, metavar="GB", help="auto: memory METIS may use (default: 3/4 of "
                   "the memory available now)")
    p.add_argument("--feature-dtype", choices=FEATURE_DTYPES, default="float32",
                   help="how features are stored; graph servers compute in float32 (default float32)")
    p.add_argument("--scratch", metavar="DIR", help="folder for temporary files, about 16 bytes per edge "
                   "(default: beside --out)")
    p.add_argument("--seed", type=int, default=0, help="METIS / Fennel seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=_run_prepare)


def _run_prepare(args) -> int:
    from dorylus_py.partition import prepare
    from dorylus_py.partition.s3 import is_s3
    from dorylus_py.partition.source import open_source
    from dorylus_py.progress import status

    if not is_s3(args.out) and Path(args.out).exists() and not args.overwrite:
        raise DorylusError(f"{args.out}: already exists (pass --overwrite to replace it)")
    if args.memory_budget is not None and args.memory_budget <= 0:
        raise DorylusError(f"--memory-budget must be > 0 GB, got {args.memory_budget}")
    if args.scratch and not Path(args.scratch).is_dir():
        raise DorylusError(f"{args.scratch}: --scratch is not a folder")
    t0 = time.perf_counter()
    status(f"reading {args.input}")
    source = open_source(args.input, _sources(args))
    budget = None if args.memory_budget is None else int(args.memory_budget * 2**30)
    m = prepare(source, args.out, args.partitions, args.partitioner, args.seed, args.overwrite, progress=status,
                feature_dtype=args.feature_dtype, memory_budget=budget, scratch=args.scratch)
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
    from dorylus_py.config import BACKENDS, FEATURE_NORMS, MODES, TrainConfig

    d = TrainConfig()
    p = _command(
        sub,
        "train",
        "train a GCN and write a run record (config.json, metrics.jsonl, summary.json, weights)",
        [data],
        DATA_FORMATS + "\nWithout --data, a graph is generated with `dorylus synth`'s defaults.\n",
    )
    p.add_argument("--data", metavar="PATH", help="dataset or prepared folder (default: a generated graph)")
    p.add_argument("--backend", choices=BACKENDS, default=d.backend,
                   help="reference: single-process full-batch oracle; local: graph/weight server processes with "
                        "tensor work in emulated Lambdas; lambda: the same with AWS Lambda (see docs/aws.md); cpu/gpu: the same pipeline with tensor work inside the "
                        "graph servers, on the CPU or a CUDA device (default reference)")
    p.add_argument("--out", metavar="RUN_DIR", help="run record folder (default runs/DATE-TIME-BACKEND)")
    p.add_argument("--overwrite", action="store_true", help="reuse a non-empty RUN_DIR")
    m = p.add_argument_group("model and optimiser")
    m.add_argument("--layers", type=int, default=d.layers, help=f"GCN layers (default {d.layers})")
    m.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden width (default {d.hidden})")
    m.add_argument("--dropout", type=float, default=d.dropout, help=f"dropout on each layer's input (default {d.dropout})")
    m.add_argument("--weight-decay", type=float, default=d.weight_decay, help=f"L2 on the first layer (default {d.weight_decay})")
    m.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    m.add_argument("--epochs", type=int, default=d.epochs, help=f"epochs (default {d.epochs})")
    m.add_argument("--seed", type=int, default=d.seed, help="weights and dropout seed (default 0)")
    m.add_argument("--feature-norm", choices=FEATURE_NORMS, default=d.feature_norm, help="row: rows sum to 1; auto (default): row when all features are >= 0")
    m.add_argument("--threads", type=int, default=d.threads, help="torch threads (default: torch's choice)")
    m.add_argument("--target-acc", type=float, default=d.target_acc, help="stop once validation accuracy reaches this")
    c = p.add_argument_group("distributed backends (local, cpu, gpu)")
    c.add_argument("--graph-servers", "-k", type=int, default=d.graph_servers, help=f"graph servers = partitions (default {d.graph_servers})")
    c.add_argument("--weight-servers", type=int, default=d.weight_servers, help=f"weight servers; layer l on server l %% M (default {d.weight_servers})")
    c.add_argument("--chunks", type=int, default=d.chunks, help=f"vertex intervals per graph server (default {d.chunks})")
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
    c.add_argument("--partitioner", choices=("auto", "metis", "fennel", "hash"), default="auto",
                   help="when --data is not a prepared folder (default auto; see `dorylus prepare --help`)")
    c.add_argument("--lambdas", type=int, default=d.lambdas, help=f"local: concurrent emulated Lambdas in all (default {d.lambdas})")
    c.add_argument("--lambda-latency-ms", type=float, default=d.lambda_latency_ms, help="local: injected latency per invocation (default 0)")
    c.add_argument("--lambda-fail-rate", type=float, default=d.lambda_fail_rate, help="local: chance an invocation fails (default 0)")
    c.add_argument("--lambda-cold-start-ms", type=float, default=d.lambda_cold_start_ms,
                   help="local: the first invocation on each emulated Lambda (and on each replacement of a dead "
                        "one) waits this long, as a cold container does (default 0)")
    c.add_argument("--lambda-memory-mb", type=int, default=d.lambda_memory_mb, help=f"billed Lambda memory (default {d.lambda_memory_mb})")
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
    c.add_argument("--max-restarts", type=int, default=d.max_restarts,
                   help="restart the servers after one dies or goes silent at most this often, each time from "
                        f"the newest checkpoint, before the job stops with the reason (default {d.max_restarts})")
    c.add_argument("--resume", action="store_true",
                   help="continue from the newest checkpoint in the partition store's checkpoints/: weights, Adam "
                        "state and epoch; training goes on to --epochs (needs --data to be a prepared store)")
    c.add_argument("--relaunch-min-s", type=float, default=d.relaunch_min_s, help=f"relaunch a task after max(this, factor x average) (default {d.relaunch_min_s})")
    c.add_argument("--relaunch-factor", type=float, default=d.relaunch_factor, help=f"(default {d.relaunch_factor})")
    c.add_argument("--wait-timeout-s", type=float, default=d.wait_timeout_s, help=f"give up on any single wait after this (default {d.wait_timeout_s:.0f})")
    g = p.add_argument_group("decentralised modes (--mode gossip | allreduce): Cluster-GCN batches on data-parallel workers")
    g.add_argument("--workers", type=int, default=d.workers, help=f"worker processes (default {d.workers}; under torchrun: its world size)")
    g.add_argument("--clusters", type=int, default=d.clusters, help=f"METIS clusters of the graph (default {d.clusters})")
    g.add_argument("--clusters-per-batch", type=int, default=d.clusters_per_batch, help=f"clusters joined into one batch (default {d.clusters_per_batch})")
    g.add_argument("--diag-lambda", type=float, default=d.diag_lambda, help=f"diagonal enhancement of the batch adjacency (default {d.diag_lambda})")
    g.add_argument("--gossip-every", type=int, default=d.gossip_every, help=f"gossip: average gradients with a partner every k local steps (default {d.gossip_every})")
    g.add_argument("--straggler", default=d.straggler, metavar="RANK:FACTOR", help="slow worker RANK down FACTOR times (experiments)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(run=_run_train)


def _run_train(args) -> int:
    from dorylus_py.config import DECENTRAL_MODES, TrainConfig
    from dorylus_py.data import SynthConfig, generate, load_graph
    from dorylus_py.progress import status
    from dorylus_py.training import RunRecord, train_reference
    from dorylus_py.training.reference import feature_norm_for, resolve_feature_norm

    cfg = _config_from_args(TrainConfig, args)
    cluster = None
    if args.cluster:
        from dorylus_py.cluster.spec import ClusterSpec

        if cfg.backend == "reference":
            raise DorylusError("--cluster needs a distributed backend (local, lambda, cpu or gpu)")
        cluster = ClusterSpec.load(args.cluster)
        if not _is_prepared_store(cfg.data):
            raise DorylusError("--cluster needs --data to be a folder made by `dorylus prepare` (or its s3:// "
                               "address), readable by the graph servers")
        if cfg.backend == "lambda":
            cfg = dataclasses.replace(cfg, lambda_function=cfg.lambda_function or cluster.lambda_function,
                                      aws_region=cfg.aws_region or cluster.region)
    cfg.check()
    if cfg.backend == "lambda" and cluster is None and not cfg.lambda_run_here:
        raise DorylusError("--backend lambda needs --cluster FILE: Lambdas must reach the graph and weight servers at "
                           "addresses in that file (or --lambda-run-here, for tests against moto)")
    store = _ready_store(cfg)
    if store is not None:  # the graph servers read it; the driver needs only its manifest
        graph, summary = None, store.manifest["summary"]
        norm = feature_norm_for(cfg.feature_norm, store.manifest["features_nonnegative"], cfg.data)
    elif cfg.data is None:
        synth = SynthConfig()
        status(f"no --data: generating a graph ({synth.nodes:,} vertices, {synth.edges:,} edges, seed {synth.seed})")
        graph = generate(synth)
    else:
        status(f"loading {cfg.data}")
        graph = load_graph(cfg.data, _sources(args))
    if graph is not None:
        summary, norm = graph.summary(), resolve_feature_norm(cfg, graph)
    if cfg.resume:  # checked before anything is written
        from dorylus_py.checkpoint import checkpoint_root, load_checkpoint

        if not _is_prepared_store(cfg.data):
            raise DorylusError("--resume needs --data to be the prepared store (folder or s3://) holding the checkpoints")
        done = int(load_checkpoint(checkpoint_root(cfg.data))["epoch"])
        if done >= cfg.epochs:
            raise DorylusError(f"the newest checkpoint in {checkpoint_root(cfg.data)} is at epoch {done}; "
                               f"--epochs {cfg.epochs} leaves nothing to do")
    run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.mode if cfg.mode in DECENTRAL_MODES else cfg.backend}")
    config = cfg.to_dict() | {"feature_norm": norm, "graph": summary, "graph_source": cfg.data if graph is None else graph.source}
    if cfg.mode in DECENTRAL_MODES:
        from dorylus_py.decentral.launcher import train_decentral

        result = train_decentral(cfg, graph, run_dir, config, args.overwrite, show_progress=not args.quiet)
        if result is None:  # a torchrun rank other than 0: rank 0 writes the record
            return 0
        s = result.summary
        print(f"{s['batches_trained']} batches trained by {s['workers']} workers, {s['gossip_rounds']} gossip exchanges"
              + (f", workers lost: {s['worker_deaths']}" if s["worker_deaths"] else ""))
    elif cfg.backend == "reference":
        record = RunRecord(run_dir, config, overwrite=args.overwrite)
        s = train_reference(graph, cfg, record, show_progress=not args.quiet).summary
    else:
        from dorylus_py.cluster.launcher import train_distributed

        record = RunRecord(run_dir, config, overwrite=args.overwrite)
        parts = _partitions_for(cfg, graph, run_dir, args.partitioner)
        from dorylus_py.checkpoint import checkpoint_root

        s = train_distributed(cfg, parts, record, norm, show_progress=not args.quiet, cluster=cluster,
                              resume_from=checkpoint_root(cfg.data) if cfg.resume else None).summary
    print(
        f"best validation accuracy {s['best_val_acc']:.4f} at epoch {s['best_epoch']}, "
        f"test accuracy there {s['test_acc_at_best_val']:.4f}; final loss {s['final_loss']:.4f}; "
        f"{s['epochs']} epochs in {s['wall_s']:.1f} s (median {1000 * s['median_epoch_s']:.1f} ms/epoch); "
        f"run record in {run_dir}"
    )
    return 0


def _add_report(sub) -> None:
    p = _command(sub, "report", "accuracy, time and cost (as if on AWS) of runs, side by side, from their run records")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run records written by `dorylus train --out`")
    p.add_argument("--as-instance", default="c5.2xlarge", help="EC2 type each graph/weight server is priced as (default c5.2xlarge)")
    p.add_argument("--region", default="us-east-1", help="price region (default us-east-1)")
    p.add_argument("--prices", metavar="FILE", help="price table JSON replacing the built-in one (same layout)")
    p.add_argument("--arch", choices=("x86", "arm"), default="x86", help="Lambda architecture priced (default x86)")
    p.add_argument("--target-acc", type=float, help="also report the wall time to reach this validation accuracy")
    p.add_argument("--markdown", metavar="FILE.md", help="also write the report as Markdown")
    p.add_argument("--html", metavar="FILE.html", help="also write a self-contained HTML report, plots inlined")
    p.add_argument("--plots", metavar="DIR", help="also write PNG plots: accuracy vs time and vs cost, and one "
                   "pipeline timeline per run (its first epochs)")
    p.add_argument("--timeline-epochs", type=int, default=2, help="epochs shown in a timeline (default 2)")
    p.set_defaults(run=_run_report)


def _run_report(args) -> int:
    import tempfile

    from dorylus_py.atomic import atomic_file
    from dorylus_py.cost.model import Prices
    from dorylus_py.cost.report import html, markdown, report_rows, text_table

    prices = Prices.load(args.prices, args.region, args.arch)
    prices.hourly(args.as_instance)  # an unknown instance type is an error before any work
    rows = report_rows(args.runs, prices, args.as_instance, args.target_acc)
    print(text_table(rows))
    with tempfile.TemporaryDirectory() as tmp:
        images = []
        if args.plots or args.html:
            images = _report_plots(args, rows, Path(args.plots or tmp))
            if args.plots:
                print("wrote " + ", ".join(str(p) for p in images))
        if args.markdown:
            with atomic_file(args.markdown) as out:
                out.write_text(markdown(rows, prices, args.as_instance))
            print(f"wrote {args.markdown}")
        if args.html:
            with atomic_file(args.html) as out:
                out.write_text(html(rows, prices, args.as_instance, images))
            print(f"wrote {args.html}")
    return 0


def _report_plots(args, rows: list[dict], out: Path) -> list[Path]:
    from dorylus_py.cost.model import read_record
    from dorylus_py.cost.plots import accuracy_plots, timeline

    out.mkdir(parents=True, exist_ok=True)
    runs, written = [], []
    for d, row in zip(args.runs, rows):
        _, metrics, tasks, _ = read_record(d)
        runs.append((row["run"], metrics, row["total $"] / max(row["wall s"], 1e-9)))
        shown = [t for t in tasks if t["epoch"] <= args.timeline_epochs]
        written.append(timeline(row["run"], shown, out / f"timeline_{row['run']}.png"))
    return accuracy_plots(runs, out) + [p for p in written if p is not None]


def _add_cost(sub) -> None:
    from dorylus_py.config import TrainConfig

    d = TrainConfig()
    p = _command(sub, "cost", "price a configuration before running it (see `dorylus cost estimate --help`)")
    cost = p.add_subparsers(title="cost commands", metavar="COST_COMMAND", required=True)
    e = _command(cost, "estimate", "estimate epoch time and cost of a configuration from a graph's size and a "
                 "calibration (a previous run's record, or built-in numbers); --search lists the cheapest, the "
                 "fastest and the best-value configurations of a grid",
                 epilog="The estimate scales what the calibration run measured: Gather time with edges per server "
                        "and the widths gathered, tensor time with vertices x layer sizes, spread over the Lambdas "
                        "(or the servers' tensor threads), server speed with vCPUs relative to the calibration's "
                        "instance. From its own calibration a run is reproduced; far from it, treat the numbers as "
                        "a guide (dorylus_py/cost/estimate.py).")
    g = e.add_argument_group("the graph (from --data, or given)")
    g.add_argument("--data", metavar="PATH", help="dataset or prepared folder to read the counts from")
    g.add_argument("--nodes", type=int, help="vertices")
    g.add_argument("--edges", type=int, help="directed edges")
    g.add_argument("--features", type=int, help="feature width")
    g.add_argument("--classes", type=int, help="classes")
    g.add_argument("--layers", type=int, default=d.layers, help=f"GCN layers (default {d.layers})")
    g.add_argument("--hidden", type=int, default=d.hidden, help=f"hidden width (default {d.hidden})")
    c = e.add_argument_group("the configuration")
    c.add_argument("--backend", choices=("lambda", "local", "cpu", "gpu"), default="lambda", help="default lambda")
    c.add_argument("--graph-servers", "-k", type=int, default=d.graph_servers, help=f"default {d.graph_servers}")
    c.add_argument("--weight-servers", type=int, default=d.weight_servers, help=f"default {d.weight_servers}")
    c.add_argument("--as-instance", default="c5.2xlarge", help="EC2 type of every server (default c5.2xlarge)")
    c.add_argument("--lambdas", type=int, default=32, help="Lambdas at once (default 32)")
    c.add_argument("--lambda-memory-mb", type=int, default=d.lambda_memory_mb, help=f"default {d.lambda_memory_mb}")
    c.add_argument("--chunks", type=int, default=d.chunks, help=f"default {d.chunks}")
    c.add_argument("--tensor-threads", type=int, default=d.tensor_threads, help=f"cpu/gpu (default {d.tensor_threads})")
    c.add_argument("--epochs", type=int, default=d.epochs, help=f"default {d.epochs}")
    k = e.add_argument_group("calibration, prices and search")
    k.add_argument("--calibration", metavar="RUN_DIR", help="a distributed run's record to scale from (default: built-in)")
    k.add_argument("--calibration-instance", default="c5.2xlarge",
                   help="the EC2 type the calibration run's servers count as (default c5.2xlarge, as `dorylus report`)")
    k.add_argument("--region", default="us-east-1", help="price region (default us-east-1)")
    k.add_argument("--prices", metavar="FILE", help="price table JSON replacing the built-in one")
    k.add_argument("--arch", choices=("x86", "arm"), default="x86", help="Lambda architecture priced (default x86)")
    k.add_argument("--search", action="store_true", help="estimate a grid (backend lambda/cpu x 1-16 graph servers x "
                   "instance types x 16-256 Lambdas) and list the cheapest, fastest and best-value ones")
    k.add_argument("--top", type=int, default=5, help="rows per list with --search (default 5)")
    e.set_defaults(run=_run_cost_estimate)


ESTIMATE_COLUMNS = [
    ("backend", "{}"), ("graph servers", "{}"), ("instance", "{}"), ("lambdas", "{}"), ("epoch s", "{:.3f}"),
    ("wall s", "{:.1f}"), ("GB-s", "{:.1f}"), ("requests", "{:,}"), ("servers $", "{:.5f}"), ("lambda $", "{:.5f}"),
    ("total $", "{:.5f}"), ("value", "{:.4g}"),
]  # fmt: skip


def _run_cost_estimate(args) -> int:
    from dorylus_py.cost.estimate import Calibration, Setup, Workload, search
    from dorylus_py.cost.model import Prices
    from dorylus_py.cost.report import text_table

    prices = Prices.load(args.prices, args.region, args.arch)
    prices.hourly(args.as_instance)
    if args.data:
        from dorylus_py.data import load_graph

        s = load_graph(args.data).summary()
        counts = {k: s[k] for k in ("nodes", "edges", "features", "classes")}
    else:
        counts = {k: getattr(args, k) for k in ("nodes", "edges", "features", "classes")}
        missing = [k for k, v in counts.items() if v is None]
        if missing:
            raise DorylusError(f"give --data, or all of --nodes --edges --features --classes (missing --{missing[0]})")
    if min(counts.values()) < 1 or args.layers < 1 or args.hidden < 1:
        raise DorylusError("graph counts, --layers and --hidden must be >= 1")
    if min(args.graph_servers, args.weight_servers, args.lambdas, args.chunks, args.epochs, args.tensor_threads) < 1:
        raise DorylusError("--graph-servers, --weight-servers, --lambdas, --chunks, --epochs, --tensor-threads must be >= 1")
    work = Workload(counts["nodes"], counts["edges"],
                    [counts["features"]] + [args.hidden] * (args.layers - 1) + [counts["classes"]])
    cal = (Calibration.from_record(args.calibration, args.calibration_instance) if args.calibration
           else Calibration.default())
    setup = Setup(args.backend, args.graph_servers, args.weight_servers, args.as_instance, args.lambdas,
                  args.lambda_memory_mb, args.chunks, args.epochs, args.tensor_threads)
    print(f"graph: {work.nodes:,} vertices, {work.edges:,} edges, layers {work.dims}; {args.epochs} epochs; "
          f"prices {prices.region} ({prices.date}); calibration: {cal.source}")
    if not args.search:
        print(text_table([cal.estimate(work, setup, prices)], ESTIMATE_COLUMNS))
        return 0
    instances = [i for i in ("c5.xlarge", "c5.2xlarge", "c5.4xlarge", "c5n.2xlarge", "c5n.4xlarge", "m5.2xlarge",
                             "r5.2xlarge") if i in prices.ec2_hourly]
    rows = search(cal, work, setup, prices, instances)
    for title, key, reverse in (("cheapest", "total $", False), ("fastest", "wall s", False), ("best value", "value", True)):
        print(f"\n{title} of {len(rows)} configurations:")
        print(text_table(sorted(rows, key=lambda r: r[key], reverse=reverse)[:args.top], ESTIMATE_COLUMNS))
    return 0


def _add_aws(sub) -> None:
    p = _command(sub, "aws", "deploy on AWS: the Lambda image's build context, the cluster file from Terraform's "
                 "outputs, updating the function's image (see docs/aws.md)")
    aws = p.add_subparsers(title="aws commands", metavar="AWS_COMMAND", required=True)
    b = _command(aws, "build-context", "lay out what `docker build` needs for the Lambda image: Dockerfile, the "
                 "handler and the modules it imports")
    b.add_argument("dir", metavar="DIR", help="output folder (replaced with --overwrite)")
    b.add_argument("--overwrite", action="store_true", help="replace DIR if it is not empty")
    b.set_defaults(run=_run_build_context)
    c = _command(aws, "cluster-file", "write the cluster file the servers and the driver read, from `terraform output -json`")
    c.add_argument("--terraform-output", required=True, metavar="TF.json", help="`terraform output -json` of infra/")
    c.add_argument("--out", required=True, metavar="CLUSTER.json", help="cluster file to write")
    c.set_defaults(run=_run_cluster_file)
    u = _command(aws, "update-function", "point the Lambda function at a newly pushed image and wait until it is live")
    u.add_argument("--function", required=True, help="function name or ARN (Terraform output lambda_function)")
    u.add_argument("--image-uri", required=True, help="ECR image URI, e.g. ACCOUNT.dkr.ecr.REGION.amazonaws.com/dorylus-lambda:TAG")
    u.add_argument("--region", default="", help="AWS region (default: from the AWS environment)")
    u.add_argument("--profile", default="", help="AWS credentials profile (default: from the AWS environment)")
    u.set_defaults(run=_run_update_function)


def _run_build_context(args) -> int:
    from dorylus_py.deploy import build_context

    files = build_context(Path(args.dir), args.overwrite)
    print(f"wrote {len(files)} files to {args.dir}; next: docker build -t dorylus-lambda {args.dir} (see docs/aws.md)")
    return 0


def _run_cluster_file(args) -> int:
    from dorylus_py.deploy import write_cluster_file

    c = write_cluster_file(Path(args.terraform_output), Path(args.out))
    print(f"wrote {args.out}: driver {c['driver']}, {len(c['graph_servers'])} graph servers, "
          f"{len(c['weight_servers'])} weight servers, function {c['lambda_function']} in {c['region']}")
    return 0


def _run_update_function(args) -> int:
    from dorylus_py.deploy import update_function_image

    sha = update_function_image(args.function, args.image_uri, args.region, args.profile)
    print(f"{args.function} now runs {args.image_uri} (code sha256 {sha})")
    return 0


def _add_server(sub, role: str, help: str) -> None:
    p = _command(sub, role, help, epilog="The job token is read from the environment variable DORYLUS_TOKEN; "
                 "the driver (`dorylus train --cluster FILE`) must have the same one.")
    p.add_argument("--cluster", required=True, metavar="FILE", help="cluster file: driver, graph_servers, weight_servers addresses")
    p.add_argument("--rank", type=int, required=True, help="which graph/weight server of the file this is")
    p.add_argument("--bind", default="0.0.0.0", help="interface to listen on (default all; the file's address is advertised)")
    p.set_defaults(run=_run_server, role=role)


def _run_server(args) -> int:
    from dorylus_py.cluster.node import Stopped, serve
    from dorylus_py.cluster.spec import ClusterSpec

    cluster = ClusterSpec.load(args.cluster)
    host, port = ClusterSpec.host_port(cluster.address(args.role, args.rank))
    if args.role == "graph-server":
        from graph_servers.server import GraphServer as build
    else:
        from dorylus_py.weights.server import WeightServer as build
    try:
        serve(args.role, build, cluster.driver, args.rank, host, port, bind_host=args.bind)
    except Stopped:
        pass
    return 0


def _partitions_for(cfg, graph, run_dir: Path, partitioner: str) -> Path:
    """A prepared folder with K partitions: --data itself when it is one, else made in RUN_DIR."""
    from dorylus_py.partition import PartitionStore, prepare
    from dorylus_py.partition.s3 import is_s3
    from dorylus_py.progress import status

    if cfg.data and is_s3(cfg.data):  # cannot be re-partitioned here: it must fit as it is
        parts = PartitionStore.open(cfg.data).num_parts
        if parts != cfg.graph_servers:
            raise DorylusError(f"{cfg.data} holds {parts} partitions, not --graph-servers {cfg.graph_servers}")
        return cfg.data
    data = Path(cfg.data) if cfg.data else None
    if data is not None and (data / "manifest.json").exists():
        if PartitionStore.open(data).num_parts == cfg.graph_servers:
            return data
    status(f"partitioning into {cfg.graph_servers} parts ({partitioner})")
    prepare(graph, run_dir / "partitions", cfg.graph_servers, partitioner, overwrite=True)
    return run_dir / "partitions"


def _ready_store(cfg):
    """The prepared store a distributed run can train on as it is (``--data``, with ``--graph-servers``
    partitions), or None: then the graph is loaded (and partitioned) by the driver."""
    from dorylus_py.config import DECENTRAL_MODES
    from dorylus_py.partition import PartitionStore

    if cfg.backend == "reference" or cfg.mode in DECENTRAL_MODES or not _is_prepared_store(cfg.data):
        return None
    store = PartitionStore.open(cfg.data)
    return store if store.num_parts == cfg.graph_servers else None


def _is_prepared_store(data: str | None) -> bool:
    """``data`` is a store made by `dorylus prepare`: a folder with a manifest, or an s3:// address."""
    from dorylus_py.partition.s3 import is_s3

    return bool(data) and (is_s3(data) or (Path(data) / "manifest.json").exists())


def _check_output_file(path: Path, overwrite: bool) -> None:
    if path.exists() and not overwrite:
        raise DorylusError(f"{path}: already exists (pass --overwrite to replace it)")
    if not path.parent.exists():
        raise DorylusError(f"{path.parent}: output folder does not exist")
