"""`dorylus synth`, `dorylus check` and `dorylus prepare`: making, checking and partitioning datasets; and the
dataset flags `dorylus train` shares with them."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from dorylus_py.cli_parser import command
from dorylus_py.errors import ConfigError, DorylusError
from dorylus_py.settings import check_number, check_seed, finite_float, path_arg

DATA_FORMATS = """\
Dataset formats (PATH):
  FILE.npz        arrays src, dst, features, labels [, train_mask, val_mask, test_mask]
  FILE (other)    text edge list 'src dst' per line, '#' comments; needs --features and --labels
  DIR/ or graph.bsnap
                  Dorylus binary files graph.bsnap, features.bsnap, labels.bsnap
  FILE.pt         a saved PyG Data object (needs torch_geometric; only PyG's data classes are unpickled)
  DIR/            an OGB node-property dataset (raw/edge.csv.gz, raw/node-feat.csv.gz, ..., split/NAME/)
  DIR/            a folder made by `dorylus prepare` (the partitions are put back together)
  cora, citeseer  the reference graphs shipped with dorylus-py (Planetoid split): a name is read as a
                  path first; only where no file or folder of that name exists is it the bundled graph
Without split masks, a seeded random split of the labelled vertices is drawn (--train-frac, --val-frac).
"""


def data_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("dataset side files and split")
    g.add_argument("--features", type=path_arg, metavar="FILE.npy", help="features (N x F) for an edge list")
    g.add_argument("--labels", type=path_arg, metavar="FILE.npy", help="labels (N,) for an edge list; -1 = unlabelled")
    g.add_argument("--masks", type=path_arg, metavar="FILE.npz", help="train_mask/val_mask/test_mask arrays "
                   "(overrides the file's split)")
    g.add_argument("--train-frac", type=finite_float, default=0.1, help="random split: train fraction of labelled "
                   "vertices (default 0.1)")
    g.add_argument("--val-frac", type=finite_float, default=0.1, help="random split: validation fraction; the rest is "
                   "test (default 0.1)")
    g.add_argument("--split-seed", type=int, default=0, help="random split seed (default 0)")
    return p


def sources_of(args):
    from dorylus_py.data import Sources

    return Sources(args.features, args.labels, args.masks, args.train_frac, args.val_frac, args.split_seed)


# --- synth -----------------------------------------------------------------------------------------


def add_synth(sub) -> None:
    from dorylus_py.config import SynthConfig

    d = SynthConfig()
    p = command(
        sub,
        "synth",
        "generate a graph: degree-corrected stochastic block model, power-law degrees, label-correlated features",
    )
    p.add_argument("--out", required=True, type=path_arg, metavar="FILE.npz", help="where to write the graph (npz layout)")
    p.add_argument("--nodes", type=int, default=d.nodes, help=f"vertices (default {d.nodes:,})")
    p.add_argument("--edges", type=int, default=d.edges, help=f"directed edges, both directions counted (default {d.edges:,})")
    p.add_argument("--features", type=int, default=d.features, help=f"feature dimension (default {d.features})")
    p.add_argument("--classes", type=int, default=d.classes, help=f"classes = blocks (default {d.classes})")
    p.add_argument("--homophily", type=finite_float, default=d.homophily, help=f"chance an edge stays in its block (default {d.homophily})")
    p.add_argument("--degree-exponent", type=finite_float, default=d.degree_exponent, help=f"power-law exponent of degrees (default {d.degree_exponent})")
    p.add_argument("--feature-signal", type=finite_float, default=d.feature_signal, help=f"class centroid scale vs unit noise (default {d.feature_signal})")
    p.add_argument("--train-frac", type=finite_float, default=d.train_frac, help=f"train fraction (default {d.train_frac})")
    p.add_argument("--val-frac", type=finite_float, default=d.val_frac, help=f"validation fraction; rest is test (default {d.val_frac})")
    p.add_argument("--seed", type=int, default=d.seed, help="random seed (default 0)")
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.set_defaults(run=_run_synth)


def config_from_args(cls, args):
    """Build a config from the parsed flags of the same names (a TrainConfig's: of its sections' fields)."""
    from dorylus_py.config import SECTION_OF, TrainConfig

    names = set(SECTION_OF) if cls is TrainConfig else {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in vars(args).items() if k in names})


def _run_synth(args) -> int:
    from dorylus_py.config import SynthConfig
    from dorylus_py.data.synth import write_synth
    from dorylus_py.progress import status

    out = Path(args.out)
    check_output_file(out, args.overwrite)
    cfg = config_from_args(SynthConfig, args)
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


def add_check(sub, data) -> None:
    p = command(sub, "check", "validate a dataset and print its counts (JSON with --json)", [data], DATA_FORMATS)
    p.add_argument("path", metavar="PATH", help="dataset (see formats below)")
    p.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    p.set_defaults(run=_run_check)


def _run_check(args) -> int:
    from dorylus_py.partition import load_dataset as load_graph

    graph = load_graph(args.path, sources_of(args))
    s = graph.summary()
    if args.json:
        print(json.dumps(s))
    else:
        print(f"{args.path}: ok")
        for k, v in s.items():
            print(f"  {k:<15} {v:,.2f}" if isinstance(v, float) else f"  {k:<15} {v:,}")
    return 0


# --- prepare ---------------------------------------------------------------------------------------


def add_prepare(sub, data) -> None:
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
    p.add_argument("--out", required=True, type=path_arg, metavar="DIR", help="output folder, or s3://BUCKET/PREFIX (AWS credentials, "
                   "region and AWS_ENDPOINT_URL from the environment); must be empty unless --overwrite")
    p.add_argument("--partitioner", default="auto",
                   help="metis: minimum edge cut, needs memory; fennel: streaming, a few passes, bounded memory; "
                        "hash: by vertex id; auto (default): metis when its memory estimate fits --memory-budget, "
                        "else fennel (the choice is printed)")
    p.add_argument("--memory-budget", type=finite_float, metavar="GB", help="auto: memory METIS may use (default: 3/4 of "
                   "the memory available now)")
    p.add_argument("--feature-dtype", default="float32", help="how features are stored: float32 (default), float16 "
                   "or bfloat16; graph servers compute in float32")
    p.add_argument("--scratch", type=path_arg, metavar="DIR", help="folder for temporary files, about 16 bytes per edge "
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

    from dorylus_py.sections import MAX_SERVERS
    from dorylus_py.partition.store import check_store_out

    if args.partitions < 1:  # checked before anything is read or created
        raise ConfigError(f"--partitions must be >= 1, got {args.partitions}")
    check_number("--partitions", args.partitions, MAX_SERVERS)
    check_partitioner(args.partitioner)
    if args.feature_dtype not in FEATURE_DTYPES:
        raise ConfigError(f"--feature-dtype must be one of {', '.join(FEATURE_DTYPES)}, got {args.feature_dtype!r}")
    if args.memory_budget is not None and args.memory_budget <= 0:
        raise ConfigError(f"--memory-budget must be > 0 GB, got {args.memory_budget}")
    check_number("--memory-budget", args.memory_budget, 2**20)
    check_seed("--seed", args.seed)
    if args.scratch and not Path(args.scratch).is_dir():
        raise ConfigError(f"{args.scratch}: --scratch is not a folder")
    if not is_s3(args.out):
        check_store_out(Path(args.out), args.overwrite, args.delete_checkpoints)
    t0 = time.perf_counter()
    status(f"reading {args.input}")
    source = open_source(args.input, sources_of(args))
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


def check_partitioner(name: str) -> None:
    from dorylus_py.partition.partitioners import PARTITIONERS

    if name not in PARTITIONERS:
        raise ConfigError(f"--partitioner must be one of {', '.join(PARTITIONERS)}, got {name!r}")


def check_output_file(path: Path, overwrite: bool) -> None:
    if path.is_dir():
        raise DorylusError(f"{path}: is a folder; --out names the file to write (such as {path / 'graph.npz'})")
    if path.exists() and not overwrite:
        raise DorylusError(f"{path}: already exists (pass --overwrite to replace it)")
    if not path.parent.exists():
        raise DorylusError(f"{path.parent}: output folder does not exist")


def is_s3(path: str) -> bool:
    return str(path).startswith("s3://")
