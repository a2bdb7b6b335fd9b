"""`dorylus report` and `dorylus cost estimate`: what runs cost, from their records, and what a
configuration would cost, before it runs. Parsers here import nothing heavy; the commands do."""

from __future__ import annotations

from pathlib import Path

from dorylus_py.cli_parser import command
from dorylus_py.config import at_least
from dorylus_py.errors import DorylusError
from dorylus_py.wire_forms import WIRE_DTYPES
from dorylus_py.settings import count_or_auto


def add_report(sub) -> None:
    p = command(sub, "report", "accuracy, time and cost (as if on AWS) of runs, side by side, from their run records")
    p.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run records written by `dorylus train --out`")
    p.add_argument("--as-instance", default="c5.2xlarge", help="EC2 type each server is priced as (default c5.2xlarge)")
    p.add_argument("--weight-instance", default="", metavar="TYPE", help="EC2 type the weight servers are priced as "
                   "(default --as-instance's, or c5.xlarge when that is a GPU type: weight servers do no GPU work)")
    p.add_argument("--region", default="us-east-1", help="price region (default us-east-1)")
    p.add_argument("--prices", metavar="FILE", help="price table JSON replacing the built-in one (same layout)")
    p.add_argument("--arch", choices=("x86", "arm"), default="x86", help="Lambda architecture priced (default x86)")
    _add_lambda_zones(p)
    p.add_argument("--target-acc", type=float, help="also report the wall time to reach this validation accuracy")
    p.add_argument("--markdown", metavar="FILE.md", help="also write the report as Markdown")
    p.add_argument("--html", metavar="FILE.html", help="also write a self-contained HTML report, plots inlined")
    p.add_argument("--plots", metavar="DIR", help="also write PNG plots into DIR: accuracy vs time and vs cost, and "
                   "one pipeline timeline per run (its first epochs)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier report's --markdown or --html file "
                   "and the plots in --plots DIR (and nothing else: a file or folder holding anything the report did "
                   "not write is refused)")
    p.add_argument("--timeline-epochs", type=int, default=2, help="epochs shown in a timeline (default 2)")
    p.add_argument("--servers", action="store_true", help="also show what each server did, from its log's start "
                   "and end lines: partition, peers, Lambda pool, epochs, tasks, relaunches, bytes, peak memory")
    p.set_defaults(run=_run_report)


def _add_lambda_zones(p) -> None:
    p.add_argument("--lambda-zones", type=int, choices=(1, 2), default=1, help="zones the Lambdas run in, as infra's "
                   "lambda_zone_count: 1, the servers' (default), moves their traffic for free; with 2, the half in the "
                   "other zone pays 0.01 USD per GB each way (the transfer $ column; docs/aws.md)")


def _run_report(args) -> int:
    import tempfile

    from dorylus_py.atomic import atomic_dir, atomic_file
    from dorylus_py.cost.model import Prices
    from dorylus_py.cost.report import html, markdown, report_rows, text_table

    prices = Prices.load(args.prices, args.region, args.arch)
    for instance in (args.as_instance, args.weight_instance or args.as_instance):
        prices.hourly(instance)  # an unknown instance type is an error before any work
    plots_owned = _check_report_targets(args)
    # every file is read and checked before anything is printed or written
    timeline = TIMELINE_FIELDS if args.plots or args.html else ()
    rows = report_rows(args.runs, prices, args.as_instance, args.target_acc, args.weight_instance, timeline,
                       args.lambda_zones)
    servers = []
    if args.servers:
        from dorylus_py.cost.server_logs import server_rows, server_table

        servers = [f"\nservers of {run}:\n{server_table(server_rows(run))}" for run in args.runs]
    print(text_table(rows))
    for row in rows:
        if row["_status"] != row["status"]:  # the failure's line did not fit in the table
            print(f"{row['run']}: {row['_status']}")
        if row["_dilation"] != 1.0:
            print(f"{row['run']}: a scale model at dilation {row['_dilation']:g}: its times and Lambda seconds are the "
                  f"model's (raw / {row['_dilation']:g}; docs/lab.md)")
    for table in servers:
        print(table)
    with tempfile.TemporaryDirectory() as tmp:
        images = []
        if args.plots:
            folder = Path(args.plots)
            folder.parent.mkdir(parents=True, exist_ok=True)
            with atomic_dir(folder, plots_owned, private=False) as staging:  # the earlier plots go once these are made
                names = _report_plots(args, rows, staging)
            images = [folder / name for name in names]
            print("wrote " + ", ".join(str(p) for p in images))
        elif args.html:
            images = [Path(tmp) / name for name in _report_plots(args, rows, Path(tmp))]
        if args.markdown:
            with atomic_file(args.markdown) as out:
                out.write_text(markdown(rows, prices, args.as_instance, args.weight_instance))
            print(f"wrote {args.markdown}")
        if args.html:
            with atomic_file(args.html) as out:
                out.write_text(html(rows, prices, args.as_instance, images, args.weight_instance))
            print(f"wrote {args.html}")
    return 0


TIMELINE_FIELDS = (("epoch", "server", "chunk"), "the timeline of --plots and --html draws it")  # of a task row


def _check_report_targets(args):
    """Refuse, before anything is read or written, to write over what is not an earlier report's: without
    ``--overwrite`` no target may exist (a --plots folder may be empty); with it, the --markdown and --html
    files must carry a report's mark, and the --plots folder hold only plots (and those two files, if they lie
    in it). Returns what the plots folder may hold (``atomic.Owned``)."""
    from dorylus_py.atomic import check_replaceable, check_replaceable_file
    from dorylus_py.cost.report import HTML_MARK, MARKDOWN_MARK

    folder = Path(args.plots) if args.plots else None
    files = [(args.markdown, MARKDOWN_MARK, "a Markdown report"), (args.html, HTML_MARK, "an HTML report")]
    files = [(Path(path), mark, what) for path, mark, what in files if path]
    beside = {path.name for path, _, _ in files if folder and path.parent.resolve() == folder.resolve()}
    for path, mark, what in files:
        if path.name not in beside or folder.exists():  # in a plots folder yet to be made, it is new
            check_replaceable_file(path, lambda head, mark=mark: mark.encode() in head, args.overwrite, what)
    if folder is None:
        return None
    from dorylus_py.cost.plots import is_plot_file

    owned = lambda rel, is_dir: is_plot_file(rel, is_dir) or not is_dir and rel in beside  # noqa: E731
    check_replaceable(folder, owned, args.overwrite, "a report's plots")
    return owned


def _report_plots(args, rows: list[dict], out: Path) -> list[str]:
    """Write the plots into the folder ``out``; their file names."""
    from dorylus_py.cost.model import read_record
    from dorylus_py.cost.plots import accuracy_plots, timeline

    runs, written, used = [], [], set()
    for d, row in zip(args.runs, rows):
        _, metrics, tasks, _ = read_record(d, *TIMELINE_FIELDS)
        runs.append((row["run"], metrics, row["total $"] / max(row["wall s"], 1e-9)))
        shown = [t for t in tasks if t["epoch"] <= args.timeline_epochs]
        name = next(n for i in range(1, len(rows) + 2)
                    if (n := f"timeline_{row['run']}" + (f"_{i}" if i > 1 else "") + ".png") not in used)
        used.add(name)  # two runs of one name (a/run, b/run) get a timeline each
        written.append(timeline(row["run"], shown, out / name))
    return [p.name for p in accuracy_plots(runs, out) + [p for p in written if p is not None]]

def add_cost(sub) -> None:
    from dorylus_py.config import TrainConfig

    d = TrainConfig()
    p = command(sub, "cost", "price a configuration before running it (see `dorylus cost estimate --help`)")
    cost = p.add_subparsers(title="cost commands", metavar="COST_COMMAND", required=True)
    e = command(cost, "estimate", "estimate epoch time and cost of a configuration from a graph's size and a "
                 "calibration (a previous run's record, or built-in numbers); --search lists the cheapest, the "
                 "fastest and the best-value configurations of a grid",
                 epilog="The estimate scales what the calibration run measured: Gather time with edges per server "
                        "and the widths gathered, the graph servers' message handling with the bytes they move "
                        "(rows of every task, ghost rows: see --edge-cut), tensor time with vertices x layer sizes, "
                        "spread over the Lambdas "
                        "(or the servers' tensor threads; on gpu the dense part and Gather on one GPU per server, at a speed-up "
                        "that is assumed unless --gpu-calibration measured it), server speed with vCPUs relative to "
                        "the calibration's "
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
    g.add_argument("--edge-cut", type=float, metavar="FRACTION",
                   help="fraction of edges between partitions, for the ghost rows exchanged (default: a prepared "
                        "--data folder of K partitions gives its ghost counts; else hash's cut, (K-1)/K)")
    c = e.add_argument_group("the configuration")
    c.add_argument("--backend", choices=("lambda", "local", "cpu", "gpu"), default="lambda", help="default lambda")
    c.add_argument("--graph-servers", "-k", type=int, default=d.graph_servers, help=f"default {d.graph_servers}")
    c.add_argument("--weight-servers", type=int, default=d.weight_servers, help=f"default {d.weight_servers}")
    c.add_argument("--as-instance", default="c5.2xlarge", help="EC2 type of the graph servers (default c5.2xlarge; "
                   "--backend gpu: a GPU type, e.g. g5.xlarge)")
    c.add_argument("--weight-instance", default="", metavar="TYPE", help="EC2 type of the weight servers (default "
                   "--as-instance's, or c5.xlarge beside GPU graph servers: weight servers do no GPU work)")
    c.add_argument("--lambdas", type=int, default=32, help="Lambdas at once (default 32)")
    c.add_argument("--lambda-memory-mb", type=int, default=d.lambda_memory_mb, help=f"default {d.lambda_memory_mb}")
    c.add_argument("--chunks", type=count_or_auto, default=d.chunks, metavar="N|auto",
                   help="chunks per graph server (default auto: what `dorylus train --chunks auto` picks for each "
                        "configuration in sync mode)")
    c.add_argument("--row-cache-mb", type=int, metavar="MB", help="local/lambda: each worker's feature-row cache; it "
                   "saves the feature pulls only where it holds a graph server's features (default a quarter of "
                   "--lambda-memory-mb)")
    c.add_argument("--tensor-threads", type=int, default=d.tensor_threads, help=f"cpu/gpu (default {d.tensor_threads})")
    c.add_argument("--wire-dtype", choices=WIRE_DTYPES, default=d.wire_dtype, help="what vertex rows travel as, as "
                   "`dorylus train --wire-dtype`: the bytes counted, and the graph servers' loop time to encode and "
                   f"decode them (default {d.wire_dtype})")
    c.add_argument("--epochs", type=int, default=d.epochs, help=f"default {d.epochs}")
    k = e.add_argument_group("calibration, prices and search")
    k.add_argument("--calibration", metavar="RUN_DIR", help="a distributed run's record to scale from (default: built-in)")
    k.add_argument("--calibration-instance", default="c5.2xlarge",
                   help="the EC2 type the calibration run's servers count as (default c5.2xlarge, as `dorylus report`)")
    k.add_argument("--region", default="us-east-1", help="price region (default us-east-1)")
    k.add_argument("--prices", metavar="FILE", help="price table JSON replacing the built-in one")
    k.add_argument("--arch", choices=("x86", "arm"), default="x86", help="Lambda architecture priced (default x86)")
    _add_lambda_zones(k)
    k.add_argument("--search", action="store_true", help="estimate a grid (backend lambda/cpu x 1-16 graph servers x "
                   "CPU instance types x 16-256 Lambdas, and gpu x 1-16 graph servers x GPU instance types), list the "
                   "cheapest, fastest and best-value ones, and the best value of each kind side by side (CPU servers + "
                   "Lambdas, CPU servers only, GPU servers only)")
    k.add_argument("--gpu-speedup", type=float, metavar="X", help="gpu: one GPU does the dense tensor work X times as "
                   "fast as one tensor worker of the calibration, whatever the GPU (default: assumed, no GPU "
                   "calibration exists: V100 10x, the other GPUs scaled by memory bandwidth; dorylus_py/cost/gpu.py)")
    k.add_argument("--gpu-gather-speedup", type=float, metavar="X", help="gpu: Gather on the GPU, X times as fast as "
                   "on a calibration server (default: assumed, the dense work's factor)")
    k.add_argument("--gpu-calibration", metavar="RUN_DIR", help="a --backend gpu run's record: its measured tensor "
                   "rate gives the GPU speed-up (other GPUs scaled by memory bandwidth) instead of the assumption")
    k.add_argument("--gpu-calibration-instance", metavar="TYPE", help="the EC2 type whose GPU the --gpu-calibration "
                   "run used (or one with the same GPU, e.g. g5.xlarge for an A10G)")
    k.add_argument("--top", type=int, default=5, help="rows per list with --search (default 5)")
    e.set_defaults(run=_run_cost_estimate)


def _estimate_columns():
    """The estimate's columns, in the report's formats (``cost/report.py``: one per kind of column)."""
    from dorylus_py.cost.report import COUNT, EPOCH_SECONDS, GB_SECONDS, SECONDS, TEXT, USD, VALUE

    estimate = [
        ("backend", TEXT), ("graph servers", COUNT), ("instance", TEXT), ("lambdas", COUNT), ("epoch s", EPOCH_SECONDS),
        ("wall s", SECONDS), ("server GB/epoch", "{:,.2f}"), ("GB-s", GB_SECONDS), ("requests", COUNT),
        ("servers $", USD), ("lambda $", USD), ("transfer $", USD), ("total $", USD), ("value", VALUE),
    ]  # fmt: skip
    comparison = [("kind", TEXT), *estimate[:3], ("lambdas", COUNT), ("epoch s", EPOCH_SECONDS), ("wall s", SECONDS),
                  ("total $", USD), ("value", VALUE), ("value vs lambda", "{:.2f}x")]
    return estimate, comparison


def _run_cost_estimate(args) -> int:
    from dorylus_py.config import TrainConfig
    from dorylus_py.cost.estimate import Calibration, Setup, Workload, search
    from dorylus_py.cost.gpu import SEARCHED, comparison
    from dorylus_py.cost.model import Prices
    from dorylus_py.cost.report import text_table
    from dorylus_py.plan import plan

    columns, comparison_columns = _estimate_columns()
    prices = Prices.load(args.prices, args.region, args.arch)
    prices.hourly(args.as_instance)
    if args.weight_instance:
        prices.hourly(args.weight_instance)
    known_ghosts = None
    if args.data:
        from dorylus_py.cli_train import is_prepared_store

        if is_prepared_store(args.data):  # its manifest has the counts: no need to put the graph together
            from dorylus_py.partition import PartitionStore

            manifest = PartitionStore.open(args.data).manifest
            s = manifest["summary"]
            if manifest.get("partitions") == args.graph_servers and args.edge_cut is None:  # it counted its ghosts
                known_ghosts = (args.graph_servers, sum(p["ghosts"] for p in manifest["parts"]) / args.graph_servers)
        else:
            from dorylus_py.partition import load_dataset as load_graph

            s = load_graph(args.data).summary()
        counts = {k: s[k] for k in ("nodes", "edges", "features", "classes")}
    else:
        counts = {k: getattr(args, k) for k in ("nodes", "edges", "features", "classes")}
        missing = [k for k, v in counts.items() if v is None]
        if missing:
            raise DorylusError(f"give --data, or all of --nodes --edges --features --classes (missing --{missing[0]})")
    if args.row_cache_mb is not None:
        at_least("--row-cache-mb", args.row_cache_mb, 0)
    for name, value in [*counts.items(), *((k, getattr(args, k)) for k in (
            "layers", "hidden", "graph_servers", "weight_servers", "lambdas", "epochs", "tensor_threads"))]:
        at_least(f"--{name.replace('_', '-')}", value, 1)
    if args.edge_cut is not None and not 0.0 <= args.edge_cut <= 1.0:
        raise DorylusError(f"--edge-cut must be a fraction between 0 and 1, not {args.edge_cut}")
    settings = TrainConfig(backend=args.backend, graph_servers=args.graph_servers, lambdas=args.lambdas,
                           chunks=args.chunks, layers=args.layers, hidden=args.hidden)
    settings.pipeline.check()
    run = plan(settings, counts["features"], counts["classes"], counts["nodes"])
    chunks, dims = run.config.chunks, run.widths
    work = Workload(counts["nodes"], counts["edges"], dims, args.edge_cut, known_ghosts)
    cal = (Calibration.from_record(args.calibration, args.calibration_instance) if args.calibration
           else Calibration.default())
    if args.calibration:
        from dorylus_py.cost.model import dilation_of, read_record

        if (d := dilation_of(read_record(args.calibration)[0])) != 1.0:
            print(f"calibration {args.calibration}: a scale model at dilation {d:g}; its model times (raw / {d:g})")
    gpu = _gpu_speed(args, cal)
    setup = Setup(args.backend, args.graph_servers, args.weight_servers, args.as_instance, args.lambdas,
                  args.lambda_memory_mb, chunks, args.epochs, args.tensor_threads, args.row_cache_mb, args.wire_dtype,
                  args.weight_instance, args.lambda_zones)
    print(f"graph: {work.nodes:,} vertices, {work.edges:,} edges, layers {work.dims}; {args.epochs} epochs; "
          f"prices {prices.region} ({prices.date}); calibration: {cal.source}")
    gpu_instances = [i for i in SEARCHED if i in prices.ec2_hourly] if args.search else []
    if args.backend == "gpu" or gpu_instances:
        print(gpu.describe([args.as_instance] if args.backend == "gpu" and not args.search else gpu_instances))
    if not args.search:
        print(text_table([cal.estimate(work, setup, prices, gpu)], columns))
        return 0
    instances = [i for i in ("c5.xlarge", "c5.2xlarge", "c5.4xlarge", "c5n.2xlarge", "c5n.4xlarge", "m5.2xlarge",
                             "r5.2xlarge") if i in prices.ec2_hourly]
    rows = search(cal, work, setup, prices, instances, args.chunks, gpu_instances, gpu)
    for title, key, reverse in (("cheapest", "total $", False), ("fastest", "wall s", False), ("best value", "value", True)):
        print(f"\n{title} of {len(rows)} configurations:")
        print(text_table(sorted(rows, key=lambda r: r[key], reverse=reverse)[:args.top], columns))
    print("\nthe best value of each kind (value = 1 / (hours x USD); the Dorylus paper's comparison):")
    print(text_table(comparison(rows), comparison_columns))
    return 0


def _gpu_speed(args, cal):
    """The GPU speed-up: measured by a --backend gpu run's record, given, or the stated assumption."""
    from dorylus_py.cost.gpu import GpuSpeed
    from dorylus_py.cost.gpu_measured import gpu_speed_from_record
    from dorylus_py.cost.model import read_record

    if args.calibration and read_record(args.calibration)[0].get("backend") == "gpu":
        raise DorylusError("--calibration takes a CPU or Lambda run (its rates are scaled to every backend); give a "
                           "--backend gpu run as --gpu-calibration")
    if args.gpu_calibration:
        if args.gpu_speedup is not None or not args.gpu_calibration_instance:
            raise DorylusError("--gpu-calibration needs --gpu-calibration-instance (the EC2 type of its GPU) and "
                               "no --gpu-speedup")
        return gpu_speed_from_record(cal, args.gpu_calibration, args.gpu_calibration_instance, args.gpu_gather_speedup)
    return GpuSpeed.given(args.gpu_speedup, args.gpu_gather_speedup)
