"""`dorylus train`: its flags (generated from the settings sections, ``config.py``), and how they become a
run: --resume RUN_DIR (the record's configuration, its checkpoints), --cluster (server counts from the
file), the deployed Lambda's memory, the run plan, and the partition store a distributed run reads (the
data itself, or a copy in the record that --no-data-copy drops).

Only the standard library is imported at the top, like the CLI's: the parser stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

from dorylus_py.cli_data import (
    DATA_FORMATS,
    check_partitioner,
    config_from_args,
    sources_of,
)
from dorylus_py.cli_parser import command
from dorylus_py.errors import ConfigError, DorylusError

# What --resume RUN_DIR lets change; the rest of the configuration is the record's.
RESUME_OVERRIDES = ("epochs", "checkpoint_every", "target_acc", "max_restarts", "wait_timeout_s", "hang_timeout_s",
                    "replace_timeout_s", "relaunch_min_s", "relaunch_factor")
# The data a resumed run reads: the record's, checked against its checksums, unless --data names it now.
DATA_FLAGS = ("data", "features", "labels", "masks")


ABSENT_AS = {"fresh_wait_ms": 0.0}  # settings newer than a record: what a run recorded without them did


def resume_args(args, given: set[str]) -> dict:
    """``--resume RUN_DIR``: the run's flags and data from RUN_DIR/config.json (but RESUME_OVERRIDES given
    now) and --out RUN_DIR. Returns the recorded configuration. The data is --data (and its side files)
    if given now; else the record's own copy of it (RUN_DIR/partitions), if kept; else what config.json
    names, if it still holds what the record's checksums say (``training/provenance.py``)."""
    from dorylus_py.config import DECENTRAL_MODES, SECTION_OF, TrainConfig
    from dorylus_py.training.provenance import follow
    from dorylus_py.training.record_schema import read_config

    run_dir = Path(args.resume_dir)
    old = read_config(run_dir, ConfigError, "missing: --resume RUN_DIR wants the record of a distributed run")
    if old.get("backend", "reference") == "reference" or old.get("mode") in DECENTRAL_MODES:
        raise ConfigError(f"--resume {run_dir}: only distributed runs (local, lambda, cpu, gpu) continue from a "
                          "checkpoint; train this one again with --overwrite")
    data_now = "data" in given  # then its side files may be given too
    fixed = sorted(given - set(RESUME_OVERRIDES) - set(DATA_FLAGS if data_now else ())
                   - {"resume_dir", "quiet", "no_data_copy"})
    if fixed:
        raise ConfigError(f"--{fixed[0].replace('_', '-')}: --resume {run_dir} continues the run as configured in its "
                          f"config.json; only {', '.join('--' + k.replace('_', '-') for k in RESUME_OVERRIDES)} "
                          "may change, and --data with its side files")
    recorded = TrainConfig.from_dict({k: v for k, v in old.items() if k in SECTION_OF})  # checked, typed
    for name in [*SECTION_OF, *old.get("sources", {})]:
        if name in DATA_FLAGS and data_now:
            continue  # the data given now, with its side files (or none)
        if name in old.get("sources", {}):
            setattr(args, name, old["sources"][name])
        elif name in old and name not in given:
            setattr(args, name, getattr(recorded, name))
        elif name in ABSENT_AS and name not in old:  # an older release's record resumes as it ran
            setattr(args, name, ABSENT_AS[name])
    args.out, args.resume, args.cluster = str(run_dir), True, old.get("cluster")
    if "no_data_copy" not in given:
        args.no_data_copy = old.get("no_data_copy", False)
    args.kept_copy = None if data_now else kept_copy(run_dir, recorded.graph_servers)
    if not data_now and args.kept_copy is None:
        for name, path in follow(run_dir, old).items():
            setattr(args, name, path)
    return old


def checkpoints_of(cfg, run_dir: Path) -> str:
    """Where a distributed run keeps its checkpoints: --checkpoint-dir, else RUN_DIR/checkpoints."""
    return cfg.checkpoint_dir or str(run_dir / "checkpoints")


def checkpoint_epoch(cfg, checkpoints: str, store: str | None) -> int:
    """The epoch of the newest intact checkpoint, which --resume continues after; checked before anything
    is written, against the job's fingerprint when its partition ``store`` is there to read."""
    from dorylus_py.checkpoint import fingerprint, load_checkpoint, model_shapes
    from dorylus_py.partition import PartitionStore

    epochs, job, shapes = cfg.epochs, None, None
    if store is not None:
        m = PartitionStore.open(store).manifest
        widths = cfg.widths(m["features"], m["classes"])
        job = fingerprint(m, cfg.model, widths)
        shapes = model_shapes(cfg, widths)
    done = int(load_checkpoint(checkpoints, job, shapes)["epoch"])
    if done >= epochs:
        raise ConfigError(f"the newest checkpoint in {checkpoints} is at epoch {done}; --epochs {epochs} leaves "
                          "nothing to do (pass more)")
    return done


def with_cluster(cfg, path: str, given: set[str]):
    """``--cluster FILE``: the graph- and weight-server counts are the file's (a flag that disagrees is an
    error), and --data must be a prepared store with one partition per graph server."""
    from dorylus_py.partition import PartitionStore
    from dorylus_py.serving.cluster_spec import ClusterSpec

    if cfg.backend == "reference":
        raise ConfigError("--cluster needs a distributed backend (local, lambda, cpu or gpu)")
    cluster = ClusterSpec.load(path)
    counts = {"graph_servers": len(cluster.graph_servers), "weight_servers": len(cluster.weight_servers)}
    for name, n in counts.items():
        if name in given and getattr(cfg, name) != n:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(cfg, name)} disagrees with {path}, which lists "
                              f"{n} {name.replace('_', ' ')}")
    if not is_prepared_store(cfg.data):
        raise ConfigError("--cluster needs --data to be a folder made by `dorylus prepare` (or its s3:// "
                          "address), readable by the graph servers")
    parts = PartitionStore.open(cfg.data).num_parts
    if parts != counts["graph_servers"]:
        raise ConfigError(f"{cfg.data} holds {parts} partitions but {path} lists {counts['graph_servers']} graph "
                          f"servers (dorylus prepare --partitions {counts['graph_servers']})")
    if cfg.backend == "lambda":
        counts |= {"lambda_function": cfg.lambda_function or cluster.lambda_function,
                   "aws_region": cfg.aws_region or cluster.region}
    return dataclasses.replace(cfg, **counts), cluster


def with_deployed_memory(cfg, given: set[str]):
    """AWS bills the memory the function is deployed with: that is what the run records and reports price."""
    from dorylus_py.platforms.aws import deployed_memory_mb

    mb = deployed_memory_mb(cfg.lambda_function, cfg.aws_region, cfg.aws_profile, cfg.lambda_endpoint)
    if "lambda_memory_mb" in given and cfg.lambda_memory_mb != mb:
        raise ConfigError(f"--lambda-memory-mb {cfg.lambda_memory_mb} disagrees with {cfg.lambda_function}, deployed "
                          f"with {mb} MB (what AWS bills); drop the flag, or redeploy the function")
    return dataclasses.replace(cfg, lambda_memory_mb=mb)


def store_for(cfg, run_dir: Path, kept: str | None = None) -> tuple[str, bool]:
    """The partition store a distributed run reads, and whether the run makes it: ``kept`` (a resumed
    run's copy of its data, :func:`kept_copy`) if given, else --data itself when it is a store of K parts,
    else RUN_DIR/partitions (the record's copy of the data)."""
    from dorylus_py.partition import PartitionStore

    if kept is not None:
        return kept, False
    if cfg.data and is_s3(cfg.data):  # cannot be re-partitioned here: it must fit as it is
        parts = PartitionStore.open(cfg.data).num_parts
        if parts != cfg.graph_servers:
            raise DorylusError(f"{cfg.data} holds {parts} partitions, not --graph-servers {cfg.graph_servers}")
        return cfg.data, False
    if is_prepared_store(cfg.data) and PartitionStore.open(cfg.data).num_parts == cfg.graph_servers:
        return cfg.data, False
    return str(run_dir / "partitions"), True


def kept_copy(run_dir: Path, graph_servers: int) -> str | None:
    """RUN_DIR/partitions, the record's copy of its data, if it is there with ``graph_servers`` parts."""
    from dorylus_py.partition import PartitionStore

    copy = run_dir / "partitions"
    if (copy / "manifest.json").exists() and PartitionStore.open(copy).num_parts == graph_servers:
        return str(copy)
    return None


def partition_into(cfg, graph, store: Path) -> None:
    from dorylus_py.partition import prepare
    from dorylus_py.progress import status

    status(f"partitioning {cfg.data or 'the graph'} into {cfg.graph_servers} parts, one per graph server")
    prepare(graph, store, cfg.graph_servers, cfg.partitioner, overwrite=True)


def drop_data_copy(run_dir: Path) -> None:
    """--no-data-copy: what a run copied of its data into its record, gone once the run ends."""
    from dorylus_py.partition.store import delete_store

    delete_store(run_dir / "partitions")
    for name in ("graph.npz", "clusters.npy"):  # gossip / all-reduce workers read these
        (run_dir / name).unlink(missing_ok=True)


def is_prepared_store(data: str | None) -> bool:
    """``data`` is a store made by `dorylus prepare`: a folder with a manifest, or an s3:// address."""
    return bool(data) and (is_s3(data) or (Path(data) / "manifest.json").exists())


def is_s3(path: str) -> bool:
    from dorylus_py import s3

    return s3.is_s3(path)


def add_train(sub, data) -> None:
    from dorylus_py.config import SECTIONS
    from dorylus_py.settings import add_flags, path_arg

    p = command(
        sub,
        "train",
        "train a GNN (GCN, GAT or GraphSAGE) and write a run record (config.json, metrics.jsonl, summary.json, weights)",
        [data],
        DATA_FORMATS + "\nWithout --data, a graph is generated with `dorylus synth`'s defaults.\n",
    )
    p.add_argument("--out", type=path_arg, metavar="RUN_DIR", help="run record folder (default runs/DATE-TIME-BACKEND)")
    p.add_argument("--overwrite", action="store_true", help="replace RUN_DIR if it holds a run record and nothing else "
                   "(only the files dorylus wrote there are deleted; any other file is refused, naming it)")
    p.add_argument("--no-data-copy", action="store_true",
                   help="keep no copy of the data in RUN_DIR: the partitions a distributed run makes when --data is "
                        "not a prepared store of K parts (RUN_DIR/partitions), gossip's graph.npz and clusters.npy, "
                        "are deleted when the run ends (so is its --resume point; pass a `dorylus prepare` store as "
                        "--data to keep both out of the record)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    groups = {name: p.add_argument_group(section.__doc__) for name, section in SECTIONS.items()}  # its title
    for name, section in SECTIONS.items():
        add_flags(groups[name], section)
    groups["pipeline"].add_argument("--no-fuse", dest="fuse", action="store_const", const="off",
                                    help="the same as --fuse off")
    groups["pipeline"].add_argument("--cluster", metavar="FILE", help="multi-machine: the servers in this cluster file "
                                    "are started by hand (`dorylus graph-server`/`weight-server`); --data must be a "
                                    "prepared folder they can read")
    groups["recovery"].add_argument(
        "--resume", dest="resume_dir", type=path_arg, metavar="RUN_DIR",
        help="continue the distributed run recorded in RUN_DIR (interrupted, failed, or to go on to more --epochs) "
             "from its newest checkpoint, in that record and with its configuration; only "
             + ", ".join("--" + k.replace("_", "-") for k in RESUME_OVERRIDES) + " may change, and --data (with "
             "its side files) to read other data than the record's own, which is read only if it still holds what "
             "config.json's checksums say")
    p.set_defaults(run=_run_train)


def _run_train(args) -> int:
    ran = run_train(args)
    if ran is not None:  # None: a torchrun rank that did not write the record
        s, run_dir = ran
        config = json.loads((run_dir / "config.json").read_text())
        epochs = f"{s['epochs']} epoch{'s' if s['epochs'] != 1 else ''}"
        print(
            f"best validation accuracy {s['best_val_acc']:.4f} at epoch {s['best_epoch']}, "
            f"test accuracy there {s['test_acc_at_best_val']:.4f}; final loss {s['final_loss']:.4f}; "
            f"{epochs} on {trained_on(config['data'], config['graph'])} in {s['wall_s']:.1f} s "
            f"(median {1000 * s['median_epoch_s']:.1f} ms/epoch); run record in {run_dir}"
        )
        from dorylus_py.training.record import refusals

        refused = refusals(s)
        if refused:
            print(f"warning: {refused}", file=sys.stderr)
    return 0


def trained_on(data: str | None, graph: dict) -> str:
    """The data a run trained on, as its closing line names it: what --data said, or that it was generated,
    with the counts that make its accuracy mean something."""
    return (f"{data or 'a generated graph'} ({graph['nodes']:,} vertices, {graph['edges']:,} edges, "
            f"{graph['classes']} classes)")


def run_train(args) -> tuple[dict, Path] | None:
    """The run ``args`` (the flags, and ``args.given``) describe: its summary and record folder (None for a
    torchrun rank that writes no record). The Python API's ``train`` (``api.py``) runs it too."""
    from dorylus_py.config import DECENTRAL_MODES, TrainConfig
    from dorylus_py.data import SynthConfig, generate
    from dorylus_py.partition import load_dataset as load_graph
    from dorylus_py.plan import plan
    from dorylus_py.progress import status
    from dorylus_py.settings import AUTO
    from dorylus_py.training import RunRecord, train_reference
    from dorylus_py.training.provenance import note, recorded_paths
    from dorylus_py.training.reference import feature_norm_for, resolve_feature_norm

    given = args.given
    resumed = resume_args(args, given) if args.resume_dir else None
    cfg = config_from_args(TrainConfig, args)
    distributed = cfg.backend != "reference" and cfg.mode not in DECENTRAL_MODES
    cluster = None
    if args.cluster:
        cfg, cluster = with_cluster(cfg, args.cluster, given)
    elif distributed and "graph_servers" not in given and is_prepared_store(cfg.data):
        from dorylus_py.partition import PartitionStore

        cfg = dataclasses.replace(cfg, graph_servers=PartitionStore.open(cfg.data).num_parts)
    cfg.check()
    from dorylus_py.protocol.session import message_cap

    message_cap()  # DORYLUS_MAX_MESSAGE_MB, which every process of the job reads, checked before anything is created
    if cluster is None:  # the graph servers start on this host: their devices must be here
        cfg.check_devices_here()
    from dorylus_py.scale_model import check as check_scale_model

    check_scale_model(cfg, cluster is None)
    check_partitioner(cfg.partitioner)
    if cfg.backend == "lambda" and cluster is None and not cfg.lambda_run_here:
        raise DorylusError("--backend lambda needs --cluster FILE: Lambdas must reach the graph and weight servers at "
                           "addresses in that file (or --lambda-run-here, for tests against moto)")
    if cfg.backend == "lambda":
        cfg = with_deployed_memory(cfg, given)
    run_dir = Path(args.out or f"runs/{time.strftime('%Y%m%d-%H%M%S')}-{cfg.mode if cfg.mode in DECENTRAL_MODES else cfg.backend}")
    checkpoints = checkpoints_of(cfg, run_dir)
    data_now = resumed is None or "data" in given  # data named now: what the record notes of it
    store, copy = (store_for(cfg, run_dir, getattr(args, "kept_copy", None)) if distributed
                   else (None, cfg.mode in DECENTRAL_MODES))  # copy: the run writes the data into its record
    done = (checkpoint_epoch(cfg, checkpoints, None if copy else store) if resumed is not None
            else None)  # before any write
    graph, sizes = None, None  # sizes: each partition's vertices, where the store is made already
    if distributed and not copy:  # the graph servers read the store; the driver needs only its manifest
        from dorylus_py.partition import PartitionStore

        manifest = PartitionStore.open(store).manifest
        summary, source, sizes = manifest["summary"], cfg.data, [p["nodes"] for p in manifest["parts"]]
        norm = feature_norm_for(cfg.feature_norm, manifest["features_nonnegative"], store)
    elif cfg.data is None:
        synth = SynthConfig()
        status(f"no --data: generating a graph ({synth.nodes:,} vertices, {synth.edges:,} edges, seed {synth.seed})")
        graph = generate(synth)
    else:
        status(f"loading {cfg.data}")
        graph = load_graph(cfg.data, sources_of(args))
    if graph is not None:
        summary, source, norm = graph.summary(), graph.source, resolve_feature_norm(cfg, graph)
    if args.overwrite and cfg.data and not is_s3(cfg.data) and Path(cfg.data).resolve().is_relative_to(run_dir.resolve()):
        raise ConfigError(f"--data {cfg.data} lies inside {run_dir}, which --overwrite would delete")
    if distributed:  # the record keeps what the run used: the run plan's counts
        cfg = plan(cfg, summary["features"], summary["classes"], summary["nodes"], sizes).config
    config = cfg.to_dict() | {"feature_norm": norm, "graph": summary, "graph_source": source,
                              "sources": dataclasses.asdict(sources_of(args)), "cluster": args.cluster,
                              "no_data_copy": args.no_data_copy, "store": None if copy and args.no_data_copy else store}
    if data_now:  # what each data path held, checked before `predict` or --resume reads it again
        config["checksums"] = note(recorded_paths(config))
    if resumed is not None:  # the record's configuration, with what may change and when it was resumed
        changed = [*RESUME_OVERRIDES, *(("data", "sources", "graph_source", "checksums") if data_now else ())]
        config = resumed | {k: config[k] for k in changed} | {
            "resumed_after": [*resumed.get("resumed_after", []), done]}
    try:
        if cfg.mode in DECENTRAL_MODES:
            from dorylus_py.decentral.launcher import train_decentral

            result = train_decentral(cfg, graph, run_dir, config, args.overwrite, show_progress=not args.quiet)
            if result is None:  # a torchrun rank that did not write the record (the lowest live rank does)
                return None
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
            if copy:
                partition_into(cfg, graph, Path(store))
            from dorylus_py.scale_model import scale_model
            from dorylus_py.timescale import dilate

            with scale_model(cfg, cluster is None, record.dir):  # what runs gets durations x D; the record, cfg
                result = train_distributed(dilate(cfg), store, record, norm, show_progress=not args.quiet,
                                           cluster=cluster, resume_from=checkpoints if resumed is not None else None,
                                           checkpoint_dir=checkpoints)
            s = record.summary or result.summary
    finally:
        if args.no_data_copy and copy:
            drop_data_copy(run_dir)
    return s, run_dir
