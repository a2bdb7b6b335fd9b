"""How `dorylus train` turns its flags into a run: --resume RUN_DIR (the record's configuration, its
checkpoints), --cluster (server counts from the file), the deployed Lambda's memory, and the partition
store a distributed run reads (the data itself, or a copy in the record that --no-data-copy drops).

Only the standard library is imported at the top, like the CLI's: the parser stays fast.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from dorylus_py.errors import ConfigError, DorylusError


# What --resume RUN_DIR lets change; the rest of the configuration is the record's.
RESUME_OVERRIDES = ("epochs", "checkpoint_every", "target_acc", "max_restarts", "wait_timeout_s", "hang_timeout_s",
                    "replace_timeout_s", "relaunch_min_s", "relaunch_factor")


def resume_args(args, given: set[str]) -> dict:
    """``--resume RUN_DIR``: the run's flags and data from RUN_DIR/config.json (but RESUME_OVERRIDES given
    now) and --out RUN_DIR. Returns the recorded configuration."""
    from dorylus_py.config import DECENTRAL_MODES, TrainConfig
    from dorylus_py.jsonfile import read_json

    run_dir = Path(args.resume_dir)
    old = read_json(run_dir / "config.json", ConfigError, "missing: --resume RUN_DIR wants the record of a distributed run")
    if old.get("backend", "reference") == "reference" or old.get("mode") in DECENTRAL_MODES:
        raise ConfigError(f"--resume {run_dir}: only distributed runs (local, lambda, cpu, gpu) continue from a "
                          "checkpoint; train this one again with --overwrite")
    fixed = sorted(given - set(RESUME_OVERRIDES) - {"resume_dir", "quiet", "no_data_copy"})
    if fixed:
        raise ConfigError(f"--{fixed[0].replace('_', '-')}: --resume {run_dir} continues the run as configured in its "
                          f"config.json; only {', '.join('--' + k.replace('_', '-') for k in RESUME_OVERRIDES)} may change")
    for name in [*TrainConfig.__dataclass_fields__, *old.get("sources", {})]:
        if name in old.get("sources", {}):
            setattr(args, name, old["sources"][name])
        elif name in old and name not in given:
            setattr(args, name, old[name])
    args.out, args.resume, args.cluster = str(run_dir), True, old.get("cluster")
    if "no_data_copy" not in given:
        args.no_data_copy = old.get("no_data_copy", False)
    return old


def checkpoints_of(cfg, run_dir: Path) -> str:
    """Where a distributed run keeps its checkpoints: --checkpoint-dir, else RUN_DIR/checkpoints."""
    return cfg.checkpoint_dir or str(run_dir / "checkpoints")


def checkpoint_epoch(cfg, checkpoints: str, store: str | None) -> int:
    """The epoch of the newest intact checkpoint, which --resume continues after; checked before anything
    is written, against the job's fingerprint when its partition ``store`` is there to read."""
    from dorylus_py.checkpoint import fingerprint, load_checkpoint
    from dorylus_py.partition import PartitionStore

    epochs, job = cfg.epochs, None
    if store is not None:
        m = PartitionStore.open(store).manifest
        job = fingerprint(m, cfg.model, cfg.widths(m["features"], m["classes"]))
    done = int(load_checkpoint(checkpoints, job)["epoch"])
    if done >= epochs:
        raise ConfigError(f"the newest checkpoint in {checkpoints} is at epoch {done}; --epochs {epochs} leaves "
                          "nothing to do (pass more)")
    return done


def with_cluster(cfg, path: str, given: set[str]):
    """``--cluster FILE``: the graph- and weight-server counts are the file's (a flag that disagrees is an
    error), and --data must be a prepared store with one partition per graph server."""
    from dorylus_py.cluster.spec import ClusterSpec
    from dorylus_py.partition import PartitionStore

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


def last_layer_note(cfg) -> str:
    """Whether the run fuses its last layer, and why not (--fuse off, the backend, or the model)."""
    from dorylus_py.models.spec import fuses_last_layer

    if fuses_last_layer(cfg.model, cfg.layers, cfg.fuse, cfg.backend, cfg.lambda_latency_ms):
        return "last layer fused: one task per chunk does its forward, the loss and its first backward step"
    if cfg.fuse == "off":
        why = "--fuse off"
    elif cfg.model != "gcn" or cfg.layers < 2:
        why = f"fusion is gcn's with --layers >= 2, not --model {cfg.model} --layers {cfg.layers}"
    else:
        why = ("--fuse auto fuses on lambda, and on local with --lambda-latency-ms above 0, where a task saved "
               "is a round trip saved; --fuse on to fuse here")
    return f"last layer unfused ({why}): forward, loss and backward tasks"


def store_for(cfg, run_dir: Path, reuse: bool = False) -> tuple[str, bool]:
    """The partition store a distributed run reads, and whether the run makes it: --data itself when it
    is a store of K parts, else RUN_DIR/partitions (the record's copy of the data; ``reuse``: a resumed
    run's, if still there)."""
    from dorylus_py.partition import PartitionStore

    if cfg.data and is_s3(cfg.data):  # cannot be re-partitioned here: it must fit as it is
        parts = PartitionStore.open(cfg.data).num_parts
        if parts != cfg.graph_servers:
            raise DorylusError(f"{cfg.data} holds {parts} partitions, not --graph-servers {cfg.graph_servers}")
        return cfg.data, False
    if is_prepared_store(cfg.data) and PartitionStore.open(cfg.data).num_parts == cfg.graph_servers:
        return cfg.data, False
    copy = run_dir / "partitions"
    kept = reuse and (copy / "manifest.json").exists() and PartitionStore.open(copy).num_parts == cfg.graph_servers
    return str(copy), not kept


def partition_into(cfg, graph, store: Path) -> None:
    from dorylus_py.partition import prepare
    from dorylus_py.progress import status

    status(f"partitioning into {cfg.graph_servers} parts ({cfg.partitioner})")
    prepare(graph, store, cfg.graph_servers, cfg.partitioner, overwrite=True)


def drop_data_copy(run_dir: Path) -> None:
    """--no-data-copy: what a run copied of its data into its record, gone once the run ends."""
    import shutil

    shutil.rmtree(run_dir / "partitions", ignore_errors=True)
    for name in ("graph.npz", "clusters.npy"):  # gossip / all-reduce workers read these
        (run_dir / name).unlink(missing_ok=True)


def is_prepared_store(data: str | None) -> bool:
    """``data`` is a store made by `dorylus prepare`: a folder with a manifest, or an s3:// address."""
    return bool(data) and (is_s3(data) or (Path(data) / "manifest.json").exists())


def is_s3(path: str) -> bool:
    from dorylus_py.partition import s3

    return s3.is_s3(path)
