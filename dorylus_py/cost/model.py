"""What a run cost, or would cost on AWS, computed from its run record only.

``cost = server-hours x hourly price + Lambda GB-seconds x price + requests x price`` and, as in the
Dorylus paper, ``value = 1 / (time x cost)``. A run made on this machine is priced *as if* its graph
servers were ``--as-instance`` EC2 instances for the run's wall time (its weight servers
``--weight-instance``: by default the same, or c5.xlarge beside GPU types), and its emulated
Lambdas were billed what ``tasks.jsonl`` records (billed ms at the configured memory): each lease (an
invocation that serves tasks until released) for its whole run, waiting included, as AWS bills it.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path

from dorylus_py.config import DECENTRAL_MODES
from dorylus_py.cost.gpu import weight_server_type
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.jsonfile import read_json
from dorylus_py.schema import Field, check_object
from dorylus_py.timescale import model_view


PRICE = Field("float", 0, 1e6)  # USD an hour, a GB-second or a request: a number, not negative
LAMBDA_PRICE_FIELDS = {"x86_gb_second": PRICE, "arm_gb_second": PRICE, "per_request": replace(PRICE, required=True)}
REGION_FIELDS = {"ec2_hourly": Field("object", required=True, each=PRICE),
                 "lambda": Field("object", required=True, fields=LAMBDA_PRICE_FIELDS)}
PRICE_FIELDS = {"source": Field("str"), "date": Field("str"),
                "regions": Field("object", required=True, each=Field("object", fields=REGION_FIELDS))}


@dataclass(frozen=True)
class Prices:
    region: str
    ec2_hourly: dict[str, float]
    lambda_gb_second: float
    lambda_per_request: float
    source: str
    date: str

    @classmethod
    def load(cls, path: str | Path | None = None, region: str = "us-east-1", arch: str = "x86") -> "Prices":
        """The table at ``path`` (default: the built-in one), checked against :data:`PRICE_FIELDS`, for
        ``region`` and the Lambda ``arch``."""
        if path is None:
            where = "the built-in prices.json"
            raw = json.loads(resources.files("dorylus_py.cost").joinpath("prices.json").read_text())
        else:
            where = str(path)
            raw = read_json(path, ConfigError, "price file not found")
        regions = check_object(raw, PRICE_FIELDS, where, ConfigError)["regions"]
        if region not in regions:
            raise ConfigError(f"{where}: the price table has no {region!r} (regions: {_listed(regions)})")
        table, key = regions[region], f"{arch}_gb_second"
        if key not in table["lambda"]:
            raise ConfigError(f"{where}: regions.{region}.lambda has no {key}")
        return cls(region, dict(table["ec2_hourly"]), float(table["lambda"][key]), float(table["lambda"]["per_request"]),
                   raw.get("source", "?"), raw.get("date", "?"))

    def hourly(self, instance: str) -> float:
        try:
            return self.ec2_hourly[instance]
        except KeyError:
            raise ConfigError(f"no price for instance type {instance!r} in {self.region}; "
                              f"known: {_listed(sorted(self.ec2_hourly))}") from None


def _listed(names, most: int = 30) -> str:
    names = [n[:40] for n in names]
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


@dataclass(frozen=True)
class RunCost:
    servers: int
    server_hours: float
    server_usd: float
    lambda_requests: int
    lambda_gb_seconds: float
    lambda_usd: float
    wall_s: float

    @property
    def total_usd(self) -> float:
        return self.server_usd + self.lambda_usd

    @property
    def value(self) -> float:
        """1 / (time x cost), in 1 / (hour x USD)."""
        return value_of(self.wall_s, self.total_usd)


def value_of(wall_s: float, total_usd: float) -> float:
    """The paper's value, 1 / (time x cost), in 1 / (hour x USD); NaN for a run of no cost or time."""
    hour_usd = (wall_s / 3600.0) * total_usd  # 0 for a run of no cost or time (or of 1e-320 s)
    return 1.0 / hour_usd if hour_usd > 0 else float("nan")


def servers_of(config: dict) -> int:
    """Machines a run needs: one per decentralised worker, one for the reference trainer, else graph
    plus weight servers."""
    if config.get("mode") in DECENTRAL_MODES:
        return int(config.get("workers", 1))
    if config.get("backend", "reference") == "reference":
        return 1
    return int(config.get("graph_servers", 1)) + int(config.get("weight_servers", 1))


def weight_servers_of(config: dict) -> int:
    """Of :func:`servers_of`'s machines, the weight servers (none outside the Dorylus pipeline)."""
    if config.get("mode") in DECENTRAL_MODES or config.get("backend", "reference") == "reference":
        return 0
    return int(config.get("weight_servers", 1))


def run_cost(config: dict, wall_s: float, tasks: list[dict], prices: Prices, instance: str,
             weight_instance: str = "") -> RunCost:
    """Servers priced as ``instance`` for the run's wall time, weight servers as ``weight_instance``
    (default: :func:`.gpu.weight_server_type`'s, as ``dorylus cost estimate`` prices them)."""
    servers, weight = servers_of(config), weight_servers_of(config)
    hours = servers * wall_s / 3600.0
    hourly = (servers - weight) * prices.hourly(instance) + weight * prices.hourly(weight_server_type(instance, weight_instance))
    lambdas = invocations(tasks)
    gb_s = sum(t["billed_ms"] / 1000.0 * t["memory_mb"] / 1024.0 for t in lambdas)
    return RunCost(servers, hours, wall_s / 3600.0 * hourly, len(lambdas), gb_s,
                   gb_s * prices.lambda_gb_second + len(lambdas) * prices.lambda_per_request, wall_s)


def invocations(tasks: list[dict]) -> list[dict]:
    """The rows of :func:`read_record`'s tasks that are Lambda invocations, each billed: a lease's row
    (``leases.jsonl``, ``kind`` ``lease``: billed for its whole run, waiting included), or a task of a
    record from before leases (one invocation each). A task run in a lease names it (``lease``) and is
    billed through the lease's row."""
    return [t for t in tasks if str(t.get("where", "")).endswith("lambda") and "lease" not in t]


def read_record(run_dir: str | Path, task_fields: tuple[str, ...] = (),
                why: str = "") -> tuple[dict, list[dict], list[dict], dict]:
    """``config``, ``metrics`` rows, ``tasks`` rows (``leases.jsonl``'s billing rows last), ``summary`` of a
    run record, each file checked against
    its schema (``training/record_schema.py``; every task row with ``task_fields`` too, which the caller
    needs for ``why``): one line naming the file and field if not. A record whose process was killed
    before it could write ``summary.json`` gets one from its epochs."""
    from dorylus_py.training.record import summary_of_epochs
    from dorylus_py.training.record_schema import read_config, read_metrics, read_summary, read_tasks

    run_dir = Path(run_dir)
    not_a_record = f"missing; is {run_dir} a run record (dorylus train --out)?"
    config = read_config(run_dir, DataError, not_a_record)
    if not (run_dir / "metrics.jsonl").exists():
        raise DataError(f"{run_dir / 'metrics.jsonl'}: {not_a_record}")
    metrics = read_metrics(run_dir / "metrics.jsonl")
    tasks = read_tasks(run_dir / "tasks.jsonl", task_fields, why) if (run_dir / "tasks.jsonl").exists() else []
    tasks = [t for t in tasks if t["kind"] != "resize"]  # the autotuner's decisions (--lambdas auto) are no work
    if (run_dir / "leases.jsonl").exists():  # the Lambda invocations: billing rows, kind "lease" (invocations())
        tasks += read_tasks(run_dir / "leases.jsonl")
    if (run_dir / "summary.json").exists():
        summary = read_summary(run_dir / "summary.json")
    else:
        summary = summary_of_epochs(metrics, "unknown: no summary.json (was the run killed?)")
    metrics, tasks, summary = model_view(dilation_of(config), metrics, tasks, summary)  # a scale model's times
    return config, metrics, tasks, summary


def bytes_per_epoch(metrics: list[dict], server_total: bool = False) -> float:
    """Bytes through a graph server's sockets in a steady epoch (``metrics`` after the first), as the
    servers counted them: the mean of every server, or their ``server_total``. Summed over the epochs and
    divided, not a median of epochs: a server that reports an epoch after a faster peer has begun the
    next counts that peer's first rows in it (seen under load: +-15,680 bytes between two epochs of a
    600-vertex graph), which a sum cancels and a median does not."""
    steady = metrics[1:] or metrics
    of_epoch = sum if server_total else statistics.mean
    return sum(of_epoch([s["bytes"] for s in m["servers"]]) for m in steady) / len(steady)


def dilation_of(config: dict) -> float:
    """A record's D (1: not a scale model; ``timescale.py``)."""
    d = config.get("dilation", 1.0)
    return float(d) if isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 1 else 1.0
