"""Estimate a configuration's epoch time and cost before paying for it, from a calibration.

A calibration is what a finished run measured, normalised by the work it did (``Calibration.from_record``)
or the built-in one (``default_calibration.json``, measured here on a generated graph):

- graph-server seconds per unit of Gather work (edges per server x widths gathered, forward and back);
- tensor-task seconds per unit of dense work (vertices x the sum of the layers' matrix sizes);
- seconds every tensor task costs whatever its size (pulling rows and weights, pushing results,
  starting): the intercept of task durations regressed on their work, so that small calibration
  graphs, whose tasks are mostly this fixed cost, do not inflate the per-unit rate;
- idle seconds per epoch and chunk: the part of the epoch in which the busiest graph server ran
  nothing (waiting on messages and barriers), which grows with the number of chunks, not with the graph;
- graph-server seconds per byte moved: the loop thread's CPU time over the bytes through its sockets
  (``metrics.jsonl``'s ``servers``: the loop thread signs, checks and copies every message). Bytes per
  epoch are counted from the model (``Workload.bytes_per_server``: the rows every task pulls and pushes,
  and the ghost rows exchanged with the peers; GCN's, sync, unfused: async sends each chunk's gradient
  contribution apart, several times the rows of the sum); at 10 M vertices about 11 GB a ``local``
  server and epoch (3.6 GB on ``cpu``, whose tasks take their rows in-process), which neither the Gather
  work nor the tasks' FLOPs account for. The rate is the loop's: calibrate on the backend you estimate
  (an in-process calibration's loop also answers its tasks, so its rate per socket byte is higher);
- billed / measured Lambda time, tasks per epoch per (graph server x chunk), start-up seconds, and a
  factor ``overlap`` that maps the sum of the busy parts onto the epoch time the run measured.

For a configuration: graph time per epoch = rate x work / server speed; tensor time per epoch = (rate x
work + fixed cost x tasks) spread over the Lambdas (or each server's tensor threads); bytes time = rate x
bytes (one loop thread: not scaled by vCPUs); epoch = idle x chunks + overlap x (graph + tensor + bytes); wall = start-up + epochs
x epoch. Measured here (2 cores, shared):
calibrated on 200 k vertices / 4 M edges, the model predicts 2 M / 40 M within the errors printed by
``benchmarks/bench_scale.py`` (README), where a purely proportional model was off by +200 % (``cpu``). Cost is priced as ``cost/model.py`` prices a record: server-hours,
GB-seconds (a Lambda under 1769 MB gets a proportional CPU share, so runs that much longer) and
requests. From its own calibration a run is reproduced; other configurations are extrapolations.
Server speed scales with vCPUs relative to the calibration's ``--as-instance``. On ``gpu`` the dense part
of the tensor time runs on one GPU per graph server, at a speed-up that is assumed unless a GPU run
measured it (``cost/gpu.py``), and weight servers are priced as a CPU type.
"""

from __future__ import annotations

import itertools
import json
import math
import re
import statistics
from dataclasses import asdict, dataclass
from importlib import resources

from dorylus_py.config import DECENTRAL_MODES, TrainConfig, row_cache_mb
from dorylus_py.cost import transfer
from dorylus_py.cost.gpu import GPUS, GpuSpeed, gpu_of, weight_server_type
from dorylus_py.cost.model import Prices, invocations, read_record, value_of
from dorylus_py.errors import ConfigError, DataError
from dorylus_py.plan import plan
from dorylus_py.training.record_schema import record_settings
from dorylus_py.wire_forms import wire_bytes
from dorylus_py.settings import AUTO

FULL_CPU_MB = 1769  # AWS: one full vCPU at this memory size
CALIBRATION_TASK_FIELDS = ("epoch", "server", "chunk", "layer", "billed_ms")  # what from_record reads of a task
GRAPH_KINDS = ("gather", "gather_bwd", "attn_grad", "activate", "activate_bwd")  # graph work in tasks.jsonl
# (attn_grad: GAT's SDDMM; activate, activate_bwd: the fused last layer's input and its backward)


def vcpus(instance: str) -> int:
    """vCPUs of an EC2 size: large 2, xlarge 4, Nxlarge 4N (true of the c5/m5/r5/p3/g4dn/g5/g6 families)."""
    m = re.fullmatch(r"[a-z0-9-]+\.(\d*)x?large", instance)
    if m is None:
        raise ConfigError(f"cannot tell the vCPUs of instance type {instance!r}")
    size = instance.split(".", 1)[1]
    return 2 if size == "large" else 4 * int(m.group(1) or 1)


BYTES = 4  # float32 rows (what warm workers cache); labels and masks are counted apart
LABEL_BYTES = 4 + 1 + 4 + 3  # a vertex's int32 label and training mask (loss), its label and three masks (eval)
POSITION_BYTES = 4  # an async gradient contribution's rows carry int32 positions (runs: forward rows, sync sums: none)
LOOP_CPU_PER_ROW = {"float32": 1.0, "bfloat16": 1.4, "float16": 1.4, "int8": 2.7}  # a graph server's loop-thread
# CPU an epoch relative to float32's (it encodes what it sends, decodes what it gets): measured here on 50 k
# vertices / 1 M edges / 128 features, `local` K=2, at 0.51x (16-bit) and 0.28x (int8) of float32's bytes


@dataclass(frozen=True)
class Workload:
    nodes: int
    edges: int
    dims: list[int]  # [features, hidden..., classes]
    cut: float | None = None  # fraction of the edges between partitions; None: hash's, (K - 1) / K
    known_ghosts: tuple[int, float] | None = None  # (graph servers, ghosts per server) a prepared store counted

    def tensor_units(self) -> float:
        return self.nodes * sum(a * b for a, b in zip(self.dims[:-1], self.dims[1:]))

    def graph_units(self, servers: int) -> float:
        return self.edges / servers * 2 * sum(self.dims[1:])  # widths gathered, forward and backward

    def ghosts(self, servers: int) -> float:
        """Expected ghosts of one graph server: its in-edges from other partitions land on distinct
        vertices of theirs as balls in bins (random graphs; a real graph's locality gives fewer)."""
        if servers < 2:
            return 0.0
        if self.known_ghosts is not None and self.known_ghosts[0] == servers:
            return self.known_ghosts[1]
        others = self.nodes * (servers - 1) / servers
        cut = (servers - 1) / servers if self.cut is None else self.cut
        return others * -math.expm1(-(self.edges / servers * cut) / others)

    def bytes_per_server(self, servers: int, chunks: int, in_process: bool = False, features_cached: float = 0.0,
                         wire: str = "float32") -> float:
        """Bytes through one graph server's sockets in an epoch (sent and received), GCN's Â(HW) order:
        per vertex (unless the tasks run ``in_process``, the ``cpu``/``gpu`` backends; less the share
        ``features_cached`` of the feature pulls, which warm workers answer themselves), the training
        and evaluation forwards pull each layer's input and push its ``Z``, the loss pulls the logits and pushes their gradient, evaluation pulls the logits, backward pulls
        each layer's input and ``dZ`` and pushes ``dG`` of the layer below; per ghost (and per vertex a
        peer holds as one, about as many), ``Z`` of every layer twice forward and one gradient back;
        per chunk, the gradients forwarded to the weight servers. Rows travel in ``wire`` (``--wire-dtype``:
        int8 adds a 2-byte scale per row); weight gradients in float32."""
        d = self.dims

        def row(width: int) -> int:
            return wire_bytes(1, width, wire)

        per_vertex = 2 * sum(row(a) + row(b) for a, b in zip(d[:-1], d[1:])) + 3 * row(d[-1])  # forwards, loss, eval
        per_vertex += sum(row(d[l]) + row(d[l + 1]) + (row(d[l]) if l else 0) for l in range(len(d) - 1))  # backward
        per_vertex -= 3 * row(d[0]) * features_cached  # the share of layer 0's pulls (two forwards, the backward) cached
        per_ghost = 3 * sum(row(w) for w in d[1:]) + POSITION_BYTES * (len(d) - 1)  # rows, and their positions
        weights = sum(a * b for a, b in zip(d[:-1], d[1:]))
        tasks = 0.0 if in_process else self.nodes / servers * (per_vertex + LABEL_BYTES)
        return tasks + 2 * self.ghosts(servers) * per_ghost + chunks * BYTES * weights


@dataclass(frozen=True)
class Setup:
    backend: str  # local | lambda | cpu | gpu
    graph_servers: int
    weight_servers: int
    instance: str
    lambdas: int
    memory_mb: int
    chunks: int
    epochs: int
    tensor_threads: int = 2
    row_cache_mb: int | None = None  # local/lambda workers' feature cache; None: the default, a quarter of memory
    wire_dtype: str = "float32"  # what rows travel as (--wire-dtype)
    weight_instance: str = ""  # EC2 type of the weight servers; "": ``instance``, or a CPU type beside GPUs
    lambda_zones: int = 1  # zones the Lambdas run in (infra's lambda_zone_count): traffic across zones is billed

    @property
    def weight_type(self) -> str:
        return weight_server_type(self.instance, self.weight_instance)

    def bytes_per_server(self, work: Workload, wire: str | None = None) -> float:
        """Bytes through one graph server an epoch, rows in ``wire`` (default: this setup's)."""
        return work.bytes_per_server(self.graph_servers, self.chunks, in_process=self.backend in ("cpu", "gpu"),
                                     features_cached=self.cached_features(work), wire=wire or self.wire_dtype)

    def loop_bytes(self, work: Workload) -> float:
        """What a graph server's loop thread costs an epoch, in float32 bytes moved: its calibrated rate's
        unit (a narrower wire moves fewer bytes but encodes and decodes them: ``LOOP_CPU_PER_ROW``)."""
        return self.bytes_per_server(work, "float32") * LOOP_CPU_PER_ROW[self.wire_dtype]

    def cached_features(self, work: Workload) -> float:
        """The share of feature pulls that warm workers answer from their cache (``--row-cache-mb``): all
        where one worker holds its graph server's features, else the share its cache holds (a full cache
        keeps what it has, ``dorylus_py/worker/row_cache.py``)."""
        cache_mb = row_cache_mb(self.backend, self.memory_mb, self.row_cache_mb)
        return min(1.0, cache_mb * 2**20 / (work.nodes / self.graph_servers * work.dims[0] * BYTES))


@dataclass(frozen=True)
class Calibration:
    graph_s_per_unit: float
    tensor_s_per_unit: float
    billed_per_measured: float
    tasks_per_server_chunk: float
    startup_s: float
    overlap: float
    instance: str
    memory_mb: int
    source: str
    task_s: float = 0.0  # fixed seconds per tensor task
    idle_s_per_chunk: float = 0.0  # seconds per epoch and chunk in which the busiest server ran nothing
    io_s_per_byte: float = 0.0  # graph-server loop seconds per byte moved (0: the record did not measure it)

    @classmethod
    def default(cls) -> "Calibration":
        raw = json.loads(resources.files("dorylus_py.cost").joinpath("default_calibration.json").read_text())
        return cls(**raw)

    @classmethod
    def from_record(cls, run_dir: str, instance: str) -> "Calibration":
        config, metrics, tasks, _ = read_record(run_dir, CALIBRATION_TASK_FIELDS, "a calibration reads it")
        leases = [t for t in tasks if t["kind"] == "lease"]  # billing rows, not work
        tasks = [t for t in tasks if t["kind"] != "lease"]
        why = "a calibration needs a run of a distributed backend (with tasks.jsonl and epochs)"
        if config.get("backend") not in ("local", "lambda", "cpu", "gpu") or config.get("mode") in DECENTRAL_MODES:
            raise DataError(f"{run_dir}: {why}; its config.json says --backend {config.get('backend', 'reference')} "
                            f"--mode {config.get('mode', 'sync')}")
        for name, rows in (("metrics.jsonl", metrics), ("tasks.jsonl", tasks)):
            if not rows:
                raise DataError(f"{run_dir}/{name}: no rows; {why}")
        setup = setup_of(config, instance)
        work = workload_of(config)
        layer = next((t["layer"] for t in tasks if t["layer"] is None or t["layer"] >= len(work.dims) - 1), -1)
        if layer != -1:  # its work is counted from the layer's widths
            raise DataError(f"{run_dir}: tasks.jsonl has a task of layer {layer}, not one of the {len(work.dims) - 1} "
                            "layers of config.json's model")
        # a gpu record's rates are its GPU's: its threads share the one GPU, which does their summed work
        own_gpu = GpuSpeed(base=float(setup.tensor_threads), scaled=False, source=str(run_dir), gather_speedup=1.0)
        # Rates come from the steady epochs: the first one also carries start-up (process launch, first
        # touch of memory, torch's warm-up), which goes into startup_s instead.
        rows = metrics[1:] or metrics
        epochs = len(rows)
        tasks = [t for t in tasks if t["epoch"] >= rows[0]["epoch"]]
        graph_s = sum(t["end"] - t["start"] for t in tasks if t["kind"] in GRAPH_KINDS) / (setup.graph_servers * epochs)
        tensor = [t for t in tasks if t["kind"] not in GRAPH_KINDS]
        task_s = _fixed_task_seconds(tensor, work)
        tensor_s = sum(t["end"] - t["start"] for t in tensor) / epochs - task_s * len(tensor) / epochs
        billed = sum(t["billed_ms"] for t in invocations(tasks + leases)) / 1000.0  # leases: waiting included
        steady = statistics.median(m["epoch_s"] for m in rows)
        idle = _idle_seconds(tasks, rows, setup.graph_servers)
        cal = cls(graph_s / work.graph_units(setup.graph_servers), max(tensor_s, 0.0) / work.tensor_units(),
                  billed / max(sum(t["end"] - t["start"] for t in tensor), 1e-9),
                  len(tensor) / (epochs * setup.graph_servers * setup.chunks),
                  max(0.0, metrics[-1]["wall_s"] - len(metrics) * steady), 1.0, instance, setup.memory_mb, str(run_dir),
                  task_s, idle / setup.chunks, _io_seconds_per_byte(rows) * setup.bytes_per_server(work)
                  / setup.loop_bytes(work))  # per float32 byte (the same for a float32 run)
        both = cal._parts(work, setup, own_gpu)[0]
        return cls(**(asdict(cal) | {"overlap": (steady - idle) / max(both, 1e-9)}))

    def _parts(self, work: Workload, setup: Setup, gpu: GpuSpeed) -> tuple[float, float]:
        """(graph + tensor seconds per epoch before the overlap factor, summed tensor seconds)."""
        speed = vcpus(setup.instance) / vcpus(self.instance)
        graph = self.graph_s_per_unit * work.graph_units(setup.graph_servers)
        graph /= gpu.gather(setup.instance) if setup.backend == "gpu" else speed
        graph += self.io_s_per_byte * setup.loop_bytes(work)  # one loop thread: more vCPUs do not help
        tasks = self.tasks_per_server_chunk * setup.graph_servers * setup.chunks
        tensor_total = self.tensor_s_per_unit * work.tensor_units() + self.task_s * tasks
        if setup.backend == "gpu":  # the dense part on the GPU, the fixed part on the host's tensor threads
            dense = self.tensor_s_per_unit * work.tensor_units() / gpu.speedup(setup.instance)
            fixed = self.task_s * tasks / (setup.tensor_threads * speed)
            tensor = (dense + fixed) / setup.graph_servers
        elif setup.backend == "cpu":
            tensor = tensor_total / (setup.graph_servers * setup.tensor_threads * speed)
        else:
            cpu_share = min(1.0, setup.memory_mb / FULL_CPU_MB) / min(1.0, self.memory_mb / FULL_CPU_MB)
            tensor_total /= cpu_share
            tensor = tensor_total / min(setup.lambdas, max(1.0, tasks))
        return graph + tensor, tensor_total

    def estimate(self, work: Workload, setup: Setup, prices: Prices, gpu: GpuSpeed = GpuSpeed()) -> dict:
        if setup.backend == "gpu" and gpu_of(setup.instance) is None:
            raise ConfigError(f"--backend gpu needs a GPU instance type ({', '.join(GPUS)}), not {setup.instance!r}")
        both, tensor_total = self._parts(work, setup, gpu)
        epoch_s = self.idle_s_per_chunk * setup.chunks + self.overlap * both
        wall = self.startup_s + setup.epochs * epoch_s
        server_usd = wall / 3600.0 * (setup.graph_servers * prices.hourly(setup.instance)
                                      + setup.weight_servers * prices.hourly(setup.weight_type))
        lambda_usd = gb_s = requests = 0.0
        if setup.backend in ("local", "lambda"):
            gb_s = tensor_total * self.billed_per_measured * setup.epochs * setup.memory_mb / 1024.0
            requests = self.tasks_per_server_chunk * setup.graph_servers * setup.chunks * setup.epochs
            lambda_usd = gb_s * prices.lambda_gb_second + requests * prices.lambda_per_request
        transfer_usd = transfer.transfer_usd(transfer.predicted_lambda_bytes(work, setup), setup.lambda_zones)
        total = server_usd + lambda_usd + transfer_usd
        return {"backend": setup.backend, "graph servers": setup.graph_servers, "instance": setup.instance,
                "lambdas": setup.lambdas if setup.backend in ("local", "lambda") else 0,
                "server GB/epoch": setup.bytes_per_server(work) / 1e9, "epoch s": epoch_s,
                "wall s": wall, "GB-s": gb_s, "requests": int(round(requests)), "servers $": server_usd,
                "lambda $": lambda_usd, "transfer $": transfer_usd, "total $": total,
                "value": value_of(wall, total)}


def chunks_for(chunks: int | str, backend: str, graph_servers: int, lambdas: int | str, nodes: int,
               mode: str = "sync") -> int:
    """``--chunks`` as `dorylus train` resolves it: the run plan's (``plan.py``)."""
    cfg = TrainConfig.from_dict({"backend": backend, "graph_servers": graph_servers, "lambdas": lambdas, "mode": mode,
                                 "chunks": chunks})
    return plan(cfg, 1, 1, nodes).config.chunks if cfg.pipeline.distributed else int(chunks)


def setup_of(config: dict, instance: str) -> Setup:
    """The setup a run record's ``config.json`` describes, read as `dorylus train` wrote it (its settings,
    typed, with the same defaults; ``--chunks auto`` in a record of the API resolved by the run plan)."""
    cfg = config_of(config)
    chunks = plan(cfg, 1, 1, workload_of(config).nodes).config.chunks if cfg.pipeline.distributed else 1
    pool = cfg.pool
    lambdas = pool.lambdas_max if pool.lambdas is AUTO else pool.lambdas  # an autotuned run: its bound
    p = cfg.pipeline
    return Setup(p.backend, p.graph_servers, p.weight_servers, instance, int(lambdas), pool.lambda_memory_mb,
                 int(chunks), cfg.run.epochs, p.tensor_threads, pool.row_cache_mb, p.wire_dtype)


def config_of(config: dict) -> TrainConfig:
    """The settings of a record's ``config.json`` (its other fields, such as the graph's counts, left out)."""
    return record_settings(config)


def workload_of(config: dict) -> Workload:
    """The graph a record's ``config.json`` says its run trained on (its counts checked by the record's
    schema, here only that an estimate can scale from them)."""
    g = config.get("graph") or {}
    if not all(isinstance(g.get(k), int) and g[k] >= 1 for k in ("nodes", "edges", "features", "classes")):
        raise DataError("config.json lacks the graph's counts (nodes, edges, features, classes: each at least 1)")
    return Workload(g["nodes"], g["edges"], config_of(config).widths(g["features"], g["classes"]))


def search(cal: Calibration, work: Workload, base: Setup, prices: Prices, instances: list[str],
           chunks: int | str | None = None, gpu_instances: list[str] = (), gpu: GpuSpeed = GpuSpeed()) -> list[dict]:
    """Every configuration of a grid: backend x graph servers x instance x Lambdas (``lambda`` and ``cpu`` on
    ``instances``, ``gpu`` on ``gpu_instances``); ``chunks`` (default ``base.chunks``) as given to `dorylus
    train`, so ``auto`` is resolved for each configuration."""
    grid = [*itertools.product(("lambda", "cpu"), instances), *(("gpu", i) for i in gpu_instances)]
    rows = []
    for (backend, inst), k in itertools.product(grid, (1, 2, 4, 8, 16)):
        for lambdas in ((16, 32, 64, 128, 256) if backend == "lambda" else (0,)):
            n = base.chunks if chunks is None else chunks_for(chunks, backend, k, max(lambdas, 1), work.nodes)
            setup = Setup(backend, k, base.weight_servers, inst, lambdas, base.memory_mb, n, base.epochs,
                          base.tensor_threads, base.row_cache_mb, base.wire_dtype, base.weight_instance, base.lambda_zones)
            rows.append(cal.estimate(work, setup, prices, gpu))
    return rows


def _task_units(task: dict, work: Workload, rows: float) -> float:
    """Dense work of one tensor task (multiply-adds over its ``rows``): what its time grows with."""
    d, layer = work.dims, task["layer"]
    if task["kind"] == "fwd":
        return rows * d[layer] * d[layer + 1]
    if task["kind"] == "bwd":
        return rows * d[layer] * d[layer + 1] * (1 if layer == 0 else 2)
    if task["kind"] == "fused":  # the last layer's forward, dW and its input's gradient
        return rows * d[layer] * d[layer + 1] * 3
    return rows * d[-1]  # loss, eval


def _fixed_task_seconds(tensor: list[dict], work: Workload) -> float:
    """Intercept of a least-squares line through (work, duration) of the run's tensor tasks: what a task
    costs whatever its size. 0 when the tasks' work does not vary enough to tell."""
    import numpy as np

    chunks = {(t["server"], t["chunk"]) for t in tensor}
    rows = work.nodes / max(len(chunks), 1)
    units = np.array([_task_units(t, work, rows) for t in tensor])
    seconds = np.array([t["end"] - t["start"] for t in tensor])
    if len(units) < 3 or units.std() < 1e-9 * max(units.mean(), 1.0):
        return 0.0
    slope, intercept = np.polyfit(units, seconds, 1)
    return float(min(max(intercept, 0.0), seconds.min() if slope >= 0 else 0.0))


def _io_seconds_per_byte(metrics: list[dict]) -> float:
    """Median over the ``metrics`` epochs of the graph servers' loop-thread CPU seconds per byte moved."""
    rates = []
    for m in metrics:
        servers = [s for s in m.get("servers", []) if s.get("bytes") and "loop_cpu_s" in s]
        if servers:
            rates.append(sum(s["loop_cpu_s"] for s in servers) / sum(s["bytes"] for s in servers))
    return statistics.median(rates) if rates else 0.0


def _idle_seconds(tasks: list[dict], metrics: list[dict], servers: int) -> float:
    """Median over the ``metrics`` epochs of the epoch time minus the busiest server's busy time (its
    tasks and graph stages, overlaps counted once)."""
    idle = []
    for m in metrics:
        busy = 0.0
        for k in range(servers):
            spans = sorted((t["start"], t["end"]) for t in tasks if t["epoch"] == m["epoch"] and t["server"] == k)
            total, end = 0.0, -float("inf")
            for a, b in spans:
                total += max(0.0, b - max(a, end))
                end = max(end, b)
            busy = max(busy, total)
        idle.append(max(0.0, m["epoch_s"] - busy))
    return statistics.median(idle) if idle else 0.0
